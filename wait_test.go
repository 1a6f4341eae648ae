package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

type carrierUpdate struct {
	Status string `json:"status"`
}

// deliveryFlow: a step, then the carrier's event or a timeout, then a
// step that records what it saw.
func deliveryFlow(name string, timeout time.Duration, effects *counter) *Workflow[string, string] {
	return NewWorkflow(name, func(ctx *Context, order string) (string, error) {
		if _, err := Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return "ch", nil
		}); err != nil {
			return "", err
		}
		var opts []WaitOption
		if timeout > 0 {
			opts = append(opts, WithTimeout(timeout))
		}
		up, err := WaitEvent[carrierUpdate](ctx, "carrier", opts...)
		seen := up.Status
		if errors.Is(err, ErrEventTimeout) {
			seen = "timeout"
		} else if err != nil {
			return "", err
		}
		return Step(ctx, "notify", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return seen, nil
		})
	}, WithEvent[carrierUpdate]("carrier"))
}

func TestEventBeforeAndAfterWait(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := deliveryFlow("deliv", 0, effects)
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	// Sent after the run waits.
	h, err := Start(ctx, c, wf, "o1", WithRunID("d-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("d-1.charge.0") == 1 }, 10*time.Second, 10*time.Millisecond)
	res, err := c.SendEvent(ctx, "d-1", "carrier", "evt-1", json.RawMessage(`{"status":"delivered"}`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	require.Equal(t, "d-1.event=carrier.0", res.StepID)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "delivered", got)
	// After the run ended: the same event is still a duplicate (a
	// provider's late redelivery), another is refused.
	res, err = c.SendEvent(ctx, "d-1", "carrier", "evt-1", json.RawMessage(`{"status": "delivered"}`))
	require.NoError(t, err)
	require.Equal(t, EventDuplicate, res.Outcome)
	_, err = c.SendEvent(ctx, "d-1", "carrier", "evt-1", json.RawMessage(`{"status":"lost"}`))
	require.ErrorIs(t, err, ErrEventConflict)
	_, err = c.SendEvent(ctx, "d-1", "carrier", "evt-9", json.RawMessage(`{"status":"late"}`))
	require.ErrorIs(t, err, ErrRunEnded)

	// Sent before the run starts waiting: kept.
	h2, err := Start(ctx, c, wf, "o2", WithRunID("d-2"))
	require.NoError(t, err)
	res, err = c.SendEvent(ctx, "d-2", "carrier", "evt-2", json.RawMessage(`{"status":"early"}`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	got, err = h2.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "early", got)

	_, err = c.SendEvent(ctx, "nope", "carrier", "evt-3", json.RawMessage(`{}`))
	require.ErrorIs(t, err, ErrRunNotFound)
}

func TestEventTimeoutAndSleep(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := deliveryFlow("deliv-to", time.Second, effects)
	slept := NewWorkflow("sleeper", func(ctx *Context, d time.Duration) (time.Time, error) {
		start, err := Step(ctx, "before", func(context.Context) (time.Time, error) { return time.Now(), nil })
		if err != nil {
			return time.Time{}, err
		}
		if err := Sleep(ctx, "nap", d); err != nil {
			return time.Time{}, err
		}
		end, err := Step(ctx, "after", func(context.Context) (time.Time, error) { return time.Now(), nil })
		if end.Sub(start) < d {
			return end, errors.New("woke early")
		}
		return end, err
	})
	env.worker(WorkerConfig{Concurrency: 4}, wf, slept)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, "o1", WithRunID("t-1"))
	require.NoError(t, err)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "timeout", got)
	// The wait's record says it timed out by its code, which tools show
	// as "timed out" rather than as a fatal error.
	steps, err := c.Steps(ctx, "t-1")
	require.NoError(t, err)
	var timedOut []StepRecord
	for _, s := range steps {
		if s.Kind == "event" {
			timedOut = append(timedOut, s)
		}
	}
	require.Len(t, timedOut, 1, "%+v", steps)
	require.Equal(t, CodeEventTimeout, timedOut[0].Code)
	require.Empty(t, timedOut[0].EventID)

	hs, err := Start(ctx, c, slept, 2*time.Second, WithRunID("s-1"))
	require.NoError(t, err)
	_, err = hs.Result(ctx)
	require.NoError(t, err)
}

func TestHookResume(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("approve", func(ctx *Context, order string) (string, error) {
		a, err := WaitEvent[carrierUpdate](ctx, "approval", WithHookToken(order+"-approval"))
		return a.Status, err
	}, WithEvent[carrierUpdate]("approval"))
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	_, err := c.Resume(ctx, "o9-approval", "e1", json.RawMessage(`{"status":"ok"}`))
	require.ErrorIs(t, err, ErrHookNotFound)
	h, err := Start(ctx, c, wf, "o9", WithRunID("h-1"))
	require.NoError(t, err)
	var res EventResult
	require.Eventually(t, func() bool {
		res, err = c.Resume(ctx, "o9-approval", "e1", json.RawMessage(`{"status":"ok"}`))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, EventDelivered, res.Outcome)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "ok", got)
	res, err = c.Resume(ctx, "o9-approval", "e1", json.RawMessage(`{"status":"ok"}`))
	require.NoError(t, err)
	require.Equal(t, EventDuplicate, res.Outcome)
	_, err = c.Resume(ctx, "o9-approval", "e2", json.RawMessage(`{"status":"ok"}`))
	require.ErrorIs(t, err, ErrEventConflict)
}

// TestWaitCallErrors: a wait for an undeclared event, or with another
// type, fails in the body; a hook token taken by another run's wait fails
// the second wait with ErrHookTaken; a sleep of zero returns at once.
func TestWaitCallErrors(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("calls", func(ctx *Context, token string) ([]string, error) {
		var out []string
		if err := Sleep(ctx, "zero", 0); err != nil {
			return nil, err
		}
		_, err := WaitEvent[int](ctx, "undeclared")
		out = append(out, fmt.Sprint(errors.Is(err, ErrUnknownEvent)))
		_, err = WaitEvent[string](ctx, "approval")
		out = append(out, fmt.Sprint(errors.Is(err, ErrUnknownEvent)))
		if token != "" {
			_, err = WaitEvent[carrierUpdate](ctx, "approval", WithHookToken(token))
			out = append(out, fmt.Sprint(errors.Is(err, ErrHookTaken)))
		}
		return out, nil
	}, WithEvent[carrierUpdate]("approval"))
	holder := NewWorkflow("holder", func(ctx *Context, token string) (string, error) {
		a, err := WaitEvent[carrierUpdate](ctx, "approval", WithHookToken(token))
		return a.Status, err
	}, WithEvent[carrierUpdate]("approval"))
	env.worker(WorkerConfig{Concurrency: 4}, wf, holder)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	hh, err := Start(ctx, c, holder, "tok-1", WithRunID("holder-1"))
	require.NoError(t, err)
	// The holder's wait has registered the token once a resume finds it.
	require.Eventually(t, func() bool {
		_, err := c.Resume(ctx, "tok-1", "probe", json.RawMessage(`"not an object"`))
		return errors.Is(err, ErrEventPayload)
	}, 10*time.Second, 20*time.Millisecond)

	h, err := Start(ctx, c, wf, "tok-1", WithRunID("calls-1"))
	require.NoError(t, err)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"true", "true", "true"}, got)

	res, err := c.Resume(ctx, "tok-1", "e1", json.RawMessage(`{"status":"held"}`))
	require.NoError(t, err)
	require.Equal(t, "holder-1", res.RunID)
	status, err := hh.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "held", status)
}

// TestEventAfterTimeoutGoesToNextWait: a wait that timed out holds no
// event; the event sent after it fills the next wait for the same name.
func TestEventAfterTimeoutGoesToNextWait(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("twice", func(ctx *Context, _ int) (string, error) {
		_, err := WaitEvent[string](ctx, "ping", WithTimeout(time.Second))
		if !errors.Is(err, ErrEventTimeout) {
			return "", fmt.Errorf("first wait: want a timeout, got %v", err)
		}
		var se *StepError
		if !errors.As(err, &se) || se.Code != "event_timeout" {
			return "", fmt.Errorf("first wait: want a StepError with code event_timeout, got %v", err)
		}
		if _, err := Step(ctx, "between", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return WaitEvent[string](ctx, "ping")
	}, WithEvent[string]("ping"))
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("tw-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		steps, err := c.Steps(ctx, "tw-1")
		return err == nil && slices.ContainsFunc(steps, func(s StepRecord) bool { return s.StepID == "tw-1.between.0" })
	}, 20*time.Second, 20*time.Millisecond)
	res, err := c.SendEvent(ctx, "tw-1", "ping", "p1", json.RawMessage(`"pong"`))
	require.NoError(t, err)
	require.Equal(t, "tw-1.event=ping.1", res.StepID)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "pong", got)
}

// TestEventForwardedToTheWorkflowsWorker: with one worker per workflow,
// an event for a run of either reaches the worker that serves it (the
// other forwards it), and each delivery is counted once, by the worker
// that delivered it.
func TestEventForwardedToTheWorkflowsWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	mk := func(name string) *Workflow[int, string] {
		return NewWorkflow(name, func(ctx *Context, _ int) (string, error) {
			return WaitEvent[string](ctx, "go")
		}, WithEvent[string]("go"))
	}
	wfA, wfB := mk("fwd-a"), mk("fwd-b")
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	mA, err := NewMetrics(regA)
	require.NoError(t, err)
	mB, err := NewMetrics(regB)
	require.NoError(t, err)
	env.worker(WorkerConfig{Concurrency: 2, Metrics: mA}, wfA)
	env.worker(WorkerConfig{Concurrency: 2, Metrics: mB}, wfB)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	const runs = 6 // each worker answers some of the requests for the other's runs
	for i := range runs {
		for _, wf := range []*Workflow[int, string]{wfA, wfB} {
			id := fmt.Sprintf("%s-%d", wf.Name(), i)
			h, err := Start(ctx, c, wf, i, WithRunID(id))
			require.NoError(t, err)
			res, err := c.SendEvent(ctx, id, "go", "e-"+id, json.RawMessage(`"`+id+`"`))
			require.NoError(t, err)
			require.Equal(t, EventDelivered, res.Outcome)
			require.Equal(t, wf.Name(), res.Workflow)
			got, err := h.Result(ctx)
			require.NoError(t, err)
			require.Equal(t, id, got)
		}
	}
	for reg, wf := range map[*prometheus.Registry]string{regA: "fwd-a", regB: "fwd-b"} {
		fams, err := reg.Gather()
		require.NoError(t, err)
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		require.Equal(t, float64(runs), sample(byName, "jetflow_events_total", map[string]string{"workflow": wf, "outcome": "delivered"}), wf)
		require.Zero(t, sample(byName, "jetflow_events_total", map[string]string{"outcome": "error"}), wf)
	}
}
