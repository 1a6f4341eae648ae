package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// Runs of the executor before the lease (engine protocol 1: run records
// without Exec, one task per step on jetflow.task.>, timers on
// jetflow.timer.> due on jetflow.due.>) are adopted by this executor once
// no worker of that protocol is live: the worker's engine gate keeps every
// handler here from running while one is (Config.Stopping).
//
// A run is adopted by writing Exec on its record (compare-and-set, so that
// one adoption wins) and waking it: the wake's holder replays the body
// against the records the earlier executor committed, which carry the same
// step IDs and places, and goes on from there. What the earlier executor
// had begun and not committed is run again under its step ID (its
// Idempotency-Key); a wait it had begun begins again when the holder
// reaches it, so its timeout counts from the adoption.
//
// Every message the earlier executor left for a run — its start task, a
// step task, a resume task after an event or a child's end, a due timer —
// adopts the run when it is delivered, so a run asleep is adopted when its
// timer comes due (and then sleeps again: that executor kept no record of
// when a sleep or wait began, so the holder begins it anew). A message of a run already
// adopted wakes it (it may be the resume of a commit the holder has not
// seen); one of a run that ended or was replaced is acknowledged.

// Legacy is the handler of the earlier executor's task consumers
// (jetflow_start_<wf>, jetflow_step_<wf>) and its due-timer consumer
// (jetflow_due, shared by every workflow: a timer of a workflow this worker
// does not serve is handed back).
func (e *Executor) Legacy() consume.Handler { return legacyHandler{e} }

type legacyHandler struct{ e *Executor }

func (h legacyHandler) Handle(ctx context.Context, d *consume.Delivery) {
	if !h.e.handBackIfStopping(d) {
		h.e.handleLegacy(ctx, d)
	}
}

func (h legacyHandler) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

// handleLegacy adopts the run of one message of the earlier executor.
func (e *Executor) handleLegacy(ctx context.Context, d *consume.Delivery) {
	msg := d.Msg
	t, err := state.DecodeTask(msg.Data())
	if err != nil {
		e.cfg.Logger.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed task of the executor before the lease terminated")
		logSettle(e.cfg.Logger, "legacy task", msg.TermWithReason("malformed task"))
		return
	}
	log := RunLogger(e.cfg.Logger, t.Workflow, t.RunID)
	if _, ok := e.cfg.Definitions[t.Workflow]; !ok {
		logSettle(log, "legacy task", consume.NakAfter(msg, 5*time.Second)) // another worker's workflow
		return
	}
	meta, err := msg.Metadata()
	if err != nil {
		log.Warn().Err(err).Msg("task of the executor before the lease without metadata; trying again")
		logSettle(log, "legacy task", consume.NakAfter(msg, time.Second))
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	how, err := e.adopt(actx, t, meta.Sequence.Stream)
	if err != nil {
		log.Warn().Err(err).Str("subject", msg.Subject()).Msg("cannot adopt a run of the executor before the lease; trying again")
		logSettle(log, "legacy task", consume.NakAfter(msg, time.Second))
		return
	}
	ev := log.Info()
	if how == outcomeNoRecord {
		ev = log.Warn() // nothing to take over: said where it shows
	}
	ev.Str("subject", msg.Subject()).Str("step_id", t.StepID).Str("outcome", how).Msg("task of the executor before the lease taken over")
	logSettle(log, "legacy task", msg.Ack())
}

// outcomeNoRecord is adopt's answer for a step task whose run has no
// record: nothing to take over.
const outcomeNoRecord = "dropped: the run has no record"

// adopt makes t's run a run of this executor and wakes it, or, for a start
// task whose record was never written, publishes the start as this
// executor's start task (its receiver writes the record from it). It
// returns what it did; a call for an adopted run wakes it again (seq, the
// message's stream sequence, makes the wake's message ID).
func (e *Executor) adopt(ctx context.Context, t state.Task, seq uint64) (string, error) {
	run, rev, err := e.runs.Get(ctx, t.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		if t.StepID != "" {
			return outcomeNoRecord, nil
		}
		b, err := state.Encode(t)
		if err != nil {
			return "", err
		}
		identity := state.RunIdentity(t.RunID, t.Generation)
		if _, err := jetstream.PublishTask(ctx, e.cfg.Assets.JS, jetstream.RunSubject(t.Workflow, identity), identity+".adopt", b); err != nil {
			return "", fmt.Errorf("publish the start task: %w", err)
		}
		return "started", nil
	}
	if err != nil {
		return "", err
	}
	if run.Workflow != t.Workflow || run.Generation != t.Generation || !run.Status.Active() {
		return "dropped: the run ended or was replaced", nil
	}
	how := "woken"
	if run.Exec != state.ExecLease {
		run, rev, err = e.runs.Adopt(ctx, run, rev)
		if err != nil {
			return "", err
		}
		if run.Exec != state.ExecLease || !run.Status.Active() {
			return "dropped: the run ended", nil
		}
		how = "adopted"
	}
	identity := state.RunIdentity(run.RunID, run.Generation)
	if _, err := Wake(ctx, e.cfg.Assets, run, rev, "", fmt.Sprintf("%s.adopt.%d", identity, seq)); err != nil {
		return "", fmt.Errorf("wake the run: %w", err)
	}
	return how, nil
}
