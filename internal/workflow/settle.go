package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/state"
)

// settleKind is how a task message is settled once its replay has ended.
type settleKind int

const (
	// settleDispatch: publish the task of each of stepIDs, then ack.
	settleDispatch settleKind = iota + 1
	// settleRetry: nak with delay; the step runs again on redelivery.
	settleRetry
	// settleFinish: the workflow returned; record the run's end, then ack.
	settleFinish
	// settleRelease: leave the task to another attempt soon (shutdown,
	// infrastructure error), after delay when set, ReleaseDelay otherwise.
	// Nothing was committed by this attempt.
	settleRelease
	// settleDrop: the task is not the one to run its step (errNotThisTask):
	// acknowledge it, doing nothing.
	settleDrop
)

// errNotThisTask: a task that must not run its step: a redispatched task
// while a retry timer of the step is waiting, or a retry whose attempt
// already ran.
var errNotThisTask = errors.New("jetflow: not this task's step to run")

// settlement is the outcome of handling one task, decided by the replay and
// carried out by settle. Every function that can end a task's replay early
// (a step that is not this task's, a retry, an infrastructure error)
// returns one instead of unwinding; only Context.park hands it over.
type settlement struct {
	kind settleKind
	// stepIDs are the steps whose tasks a dispatch publishes, one task per
	// ID; a run advances one step at a time, so there is one today.
	stepIDs []string
	// ranStep marks a dispatch by the task that executed its own step (a
	// hand-over to the next step); otherwise the task only found the
	// frontier (a late redelivery, a duplicate's start task).
	ranStep bool
	// forget: the run waits (a sleep, an event) and its history leaves
	// the cache.
	forget bool
	delay  time.Duration
	// started is when a retried attempt started, stepID its step
	// (settleRetry).
	started time.Time
	stepID  string
	// attempt is the attempt that failed (retry).
	attempt int
	output  json.RawMessage
	err     error // workflow error (finish) or cause (release, retry)
	panic   bool
}

// settle carries out s on the task message: it acknowledges the message
// only once what s asks for (the next tasks, the run's end) is durable.
func (e *Executor) settle(ctx context.Context, log zerolog.Logger, msg natsjs.Msg, d *delivery, s *settlement) {
	switch s.kind {
	case settleDispatch:
		if id, err := e.dispatch(ctx, d, s.stepIDs, s.ranStep); err != nil {
			log.Warn().Err(err).Str("next_step_id", id).Msg("cannot publish next task; releasing")
			settleErr(log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		if s.forget {
			e.cache.forget(d.runKey())
		}
		settleErr(log, msg.Ack(), "ack")
	case settleRetry:
		e.retry(ctx, log, msg, d.task, s)
	case settleDrop:
		log.Info().Err(s.err).Msg("task dropped")
		settleErr(log, msg.Ack(), "ack")
	case settleRelease:
		if s.err != nil {
			log.Warn().Err(s.err).Msg("task released")
		}
		delay := e.cfg.ReleaseDelay
		if s.delay > 0 {
			delay = s.delay
		}
		settleErr(log, msg.NakWithDelay(delay), "nak")
	case settleFinish:
		run, err := e.finish(ctx, log, d.run, d.rev, s)
		if err == nil {
			err = e.notifyParent(ctx, run)
		}
		if errors.Is(err, jetstream.ErrNotFound) {
			// The record is gone: nothing is left to finish. (A running
			// run's record never expires; one written before that rule
			// may have.)
			log.Error().Err(err).Msg("run record gone; task dropped")
		} else if err != nil {
			log.Warn().Err(err).Msg("cannot record run end; releasing")
			settleErr(log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		e.cache.forget(d.runKey())
		settleErr(log, msg.Ack(), "ack")
	}
}

// settleErr logs err, the failure to settle a task message with what, on
// log (the task's run's logger).
func settleErr(log zerolog.Logger, err error, what string) {
	if err != nil {
		// The broker will redeliver after AckWait; the commit protocol makes
		// that harmless, so this is worth a log line, not more.
		log.Warn().Err(err).Str("settle", what).Msg("cannot settle task message")
	}
}

// dispatch publishes the task of each of stepIDs, in order, each with its
// step ID as its message ID: a task already pending for that step, or one
// within the broker's duplicate window, absorbs it. ranStep is false when
// the publishing task did not execute a step of its own (its tasks are then
// marked Redispatched). On an error it returns the step ID it failed on;
// the tasks published before it stay, and a repeat absorbs them.
func (e *Executor) dispatch(ctx context.Context, d *delivery, stepIDs []string, ranStep bool) (string, error) {
	for _, id := range stepIDs {
		t := state.StepTask(d.run, d.rev, id)
		t.Redispatched = !ranStep
		b, err := state.Encode(t)
		if err == nil {
			_, err = jetstream.PublishTask(ctx, e.cfg.Assets.JS, jetstream.TaskSubject(d.run.Workflow, d.run.RunID, id), id, b)
		}
		if err != nil {
			return id, err
		}
	}
	return "", nil
}

// finish records the run's end with compare-and-set on the revision the
// task carried; when that revision is stale (another worker finished the
// run, or it changed since) it reads the record and tries again. A run
// already in a terminal state, or a record that now holds another run under
// the same ID (another token), is left as it is.
//
// It returns the record as it ended up.
func (e *Executor) finish(ctx context.Context, log zerolog.Logger, run state.Run, rev uint64, s *settlement) (state.Run, error) {
	run, written, err := e.runs.Finish(ctx, run, rev, func(run *state.Run) {
		run.UpdatedAt = e.cfg.Now().UTC()
		switch {
		case s.err == nil && len(s.output) > state.MaxInputBytes:
			run.Status, run.Error = state.StatusFailed, &state.ErrorInfo{
				Message: fmt.Sprintf("workflow output of %d bytes is over the %d-byte limit", len(s.output), state.MaxInputBytes),
				Kind:    "output", Fatal: true,
			}
		case s.err == nil:
			run.Status, run.Output = state.StatusCompleted, s.output
		default:
			run.Status, run.Error = state.StatusFailed, errorInfo(s)
		}
		if _, err := state.Encode(*run); errors.Is(err, state.ErrInputTooLarge) {
			// Input and output together do not fit in one record.
			run.Status, run.Output = state.StatusFailed, nil
			run.Error = &state.ErrorInfo{Message: "workflow output too large to store: " + err.Error(), Kind: "output", Fatal: true}
		}
	})
	if err != nil || !written {
		return run, err
	}
	took := run.UpdatedAt.Sub(run.CreatedAt)
	e.cfg.Metrics.RunFinished(run.Workflow, string(run.Status), took)
	logRunEnd(log, run, took)
	e.cfg.Tracer.EndRun(run)
	return run, nil
}

// notifyParent hands the end of run, a child run, to its parent (see
// ParentNotifier); a run without a parent, or not ended, needs nothing.
func (e *Executor) notifyParent(ctx context.Context, run state.Run) error {
	if run.Parent == nil || !run.Status.Terminal() {
		return nil
	}
	return ParentNotifier{Assets: e.cfg.Assets, Runs: e.runs, Now: e.cfg.Now}.Notify(ctx, run)
}

// logRunEnd logs the end of run, which took took: a failure at warn level
// with the error's kind, code and message (a run that failed its input
// validation among them), a completion at debug level.
func logRunEnd(log zerolog.Logger, run state.Run, took time.Duration) {
	if run.Status != state.StatusFailed || run.Error == nil {
		log.Debug().Str("status", string(run.Status)).Str("took", logging.Duration(took)).Msg("run ended")
		return
	}
	ev := log.Warn().Str("status", string(run.Status)).Str("error_kind", run.Error.Kind).Str("error", run.Error.Message).
		Bool("fatal", run.Error.Fatal).Str("took", logging.Duration(took))
	if run.Error.Code != "" {
		ev = ev.Str("error_code", run.Error.Code)
	}
	ev.Msg("run failed")
}

func errorInfo(s *settlement) *state.ErrorInfo {
	var se *StepError
	switch {
	case s.panic:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "panic", Fatal: true}
	case errors.Is(s.err, ErrInput):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "input", Fatal: true}
	case errors.As(s.err, &se):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "step", Fatal: se.Fatal, Code: errorCode(s.err)}
	default:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "workflow", Fatal: isFatal(s.err), Code: errorCode(s.err)}
	}
}
