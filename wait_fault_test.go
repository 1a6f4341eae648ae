package jetflow

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// sleepRunsEnv sets how many runs TestFaultSleepAcrossServerRestartAndWorkerKill
// starts: 200 by default, 1,000 with JETFLOW_FAULT_FULL=1 and in make
// stress.
const sleepRunsEnv = "JETFLOW_SLEEP_RUNS"

// effectsServer serves a faultcheck.Effects to worker processes.
func effectsServer(t *testing.T) (*faultcheck.Effects, string) {
	effects := faultcheck.NewEffects()
	srv := httptest.NewServer(effects)
	t.Cleanup(srv.Close)
	return effects, srv.URL
}

// Runs each sleeping 2 s while the NATS server is restarted and one of
// the two worker processes is SIGKILLed (then replaced), both while most
// runs sleep. Every run wakes once and completes; none wakes before its
// deadline, nor before 2 s after its step before the sleep committed; the
// sleep's end and every step are committed once, and every step's side
// effect happened once at its committed attempt (another attempt only when
// a fault cut it short, or made it overlap, before its commit:
// faultcheck.Check). It logs how late the wake-ups were.
func TestFaultSleepAcrossServerRestartAndWorkerKill(t *testing.T) {
	t.Parallel()
	const nap = 2 * time.Second
	n := envCount(t, sleepRunsEnv, faultScale(200, 1000))
	env := newEnv(t, Topology{})
	effects, url := effectsServer(t)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	wf := napFlow(nil) // the definition to start by; the processes run it
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < n; i += 4 {
				ids[i] = fmt.Sprintf("nap-%d", i)
				if _, err := Start(ctxT(t, 10*time.Second), c, wf, nap, WithRunID(ids[i])); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// The runs wait in the task stream; the workers start, and the faults
	// come once half the runs have started their sleep (their step before
	// it ran) or the first wakes, whichever is first: they hit sleeping
	// runs.
	victim := startChild(t, env, "", url)
	startChild(t, env, "", url)
	asleep := func() (before, after int) {
		for _, id := range ids {
			before += len(effects.Attempts(id + ".before.0"))
			after += len(effects.Attempts(id + ".after.0"))
		}
		return before, after
	}
	// The deadlines of the test follow the sleep and the workers'
	// AckWait: a run's steps wait at most about one AckWait per fault
	// for a redelivery; a run's share of the machine's work is a fiftieth
	// of an AckWait.
	perRun := childAckWait / 50
	require.Eventually(t, func() bool { b, a := asleep(); return b >= n/2 || a > 0 }, 30*childAckWait+time.Duration(n)*perRun, childAckWait/50)
	b, a := asleep()
	require.Greater(t, b, a, "no run was asleep when the faults came")
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	_ = victim.Wait()
	require.NoError(t, env.srv.Restart())
	faulted := time.Now()
	startChild(t, env, "", url)
	t.Logf("faults with %d of %d runs past their step before the sleep, %d of them past the sleep", b, n, a)

	for _, id := range ids {
		run, err := waitRunRetrying(ctxT(t, nap+60*childAckWait+time.Duration(n)*perRun), c, id)
		require.NoError(t, err, id)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
	}
	t.Logf("all %d runs completed %s after the faults", n, time.Since(faulted).Round(time.Millisecond))

	// Every run completed with three steps committed once, and every
	// step's side effect happened at its committed attempt; another attempt
	// only when a fault cut it short, or overlapped it, before its commit.
	ledger := faultcheck.NewLedger()
	for _, id := range ids {
		ledger.Accepted(id, true)
	}
	v := faultcheck.Check(ctxT(t, 30*childAckWait), c.assets, ledger, effects, writes, 3, childAckWait)
	require.NoError(t, writes.Stop())
	t.Logf("%s", v)
	require.True(t, v.OK(), v.String())
	require.Equal(t, n, v.Completed)
	require.Equal(t, n, v.WaitSteps, "one sleep's end per run")
	require.Equal(t, 2*n, v.SideEffects-v.Reruns, "before and after ran once per run, or again only before their commit")

	var late, lateAfter []time.Duration
	for _, id := range ids {
		steps, err := stepsOf(ctxT(t, 5*time.Second), c, id)
		require.NoError(t, err)
		before, sleep, after := steps["before.0"], steps["nap.0"], steps["after.0"]
		require.Equal(t, "sleep", sleep.Kind, id)
		var ranAt time.Time
		require.NoError(t, json.Unmarshal(after.Output, &ranAt), id)
		require.False(t, sleep.CommittedAt.Before(sleep.WakeAt), "%s woke at %s, before its deadline %s", id, sleep.CommittedAt, sleep.WakeAt)
		require.GreaterOrEqual(t, sleep.WakeAt.Sub(before.CommittedAt), nap, "%s: deadline counted from before the sleep began", id)
		require.GreaterOrEqual(t, ranAt.Sub(before.CommittedAt), nap, "%s: the step after the sleep ran too early", id)
		late = append(late, sleep.CommittedAt.Sub(sleep.WakeAt))
		lateAfter = append(lateAfter, ranAt.Sub(sleep.WakeAt))
	}
	p50, p90, p99, maxL := quantiles(late)
	t.Logf("%d runs, sleep %s: wake (sleep's end committed) - deadline: p50=%s p90=%s p99=%s max=%s",
		n, nap, p50.Round(time.Millisecond), p90.Round(time.Millisecond), p99.Round(time.Millisecond), maxL.Round(time.Millisecond))
	p50, p90, p99, maxL = quantiles(lateAfter)
	t.Logf("step after the sleep ran - deadline: p50=%s p90=%s p99=%s max=%s",
		p50.Round(time.Millisecond), p90.Round(time.Millisecond), p99.Round(time.Millisecond), maxL.Round(time.Millisecond))
}

// A worker process dies (SIGKILL) in the step after an event wait, after
// the event was consumed and the step's side effect happened, before the
// step's commit. A new worker runs the step again, with the same step ID
// and the next attempt, and with the same event payload; the event is
// committed once and the run completes with it.
func TestFaultWorkerKilledBetweenEventAndNextCommit(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects, url := effectsServer(t)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	crasher := startChild(t, env, "mid-use", url)
	h, err := Start(ctxT(t, 10*time.Second), c, eventUseFlow(nil, nil), 0, WithRunID("evk-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(effects.Attempts("evk-1.prep.0")) == 1 }, 30*childAckWait, childAckWait/50)
	// A worker runs steps before it answers events (its Start returns).
	require.NoError(t, waitReady(crasher, 30*childAckWait))
	res, err := c.SendEvent(ctxT(t, 10*time.Second), "evk-1", "paid", "pay-1", json.RawMessage(`{"ref":"A-17","amount":5}`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	require.Equal(t, "evk-1.event=paid.0", res.StepID)
	waitKilled(t, crasher, 30*childAckWait)

	// The event is committed, the step after it ran once and is not.
	steps, err := stepsOf(ctxT(t, 5*time.Second), c, "evk-1")
	require.NoError(t, err)
	require.Len(t, steps, 2, "prep and the event committed before the kill")
	require.Equal(t, "pay-1", steps["event=paid.0"].EventID)
	require.Equal(t, []int{1}, effects.Attempts("evk-1.use.0"))

	survivor := startChild(t, env, "", url)
	out, err := h.Result(ctxT(t, 30*childAckWait))
	require.NoError(t, err)
	require.Equal(t, "A-17", out)
	// The run can end before the worker answers events (its Start returns
	// after its consumers run): the repeat below needs it to answer.
	require.NoError(t, waitReady(survivor, 30*childAckWait))
	require.Equal(t, []int{1, 2}, effects.Attempts("evk-1.use.0"), "the step after the event ran again under its step ID, next attempt")
	require.Equal(t, []int{1, 2}, effects.Attempts("evk-1.use.0|A-17"), "both attempts saw the event's payload")
	require.Equal(t, []int{1}, effects.Attempts("evk-1.prep.0"))
	steps, err = stepsOf(ctxT(t, 5*time.Second), c, "evk-1")
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, 2, steps["use.0"].Attempt)
	require.Equal(t, "pay-1", steps["event=paid.0"].EventID)
	noRewrites(t, c, writes)

	// The sender's repeat once the run has ended is a duplicate and
	// changes nothing.
	res, err = c.SendEvent(ctxT(t, 10*time.Second), "evk-1", "paid", "pay-1", json.RawMessage(`{"ref":"A-17","amount":5}`))
	require.NoError(t, err)
	require.Equal(t, EventDuplicate, res.Outcome)
	noRewrites(t, c, writes)
}

// The same event (one event ID, one payload in two spellings) is sent ten
// times at once, five times with Client.SendEvent and five times as raw
// NATS requests, to two workers: exactly one send is told delivered, nine
// duplicate, all for the same wait; the step after the wait runs once. Half
// the runs get the event before the body reaches its wait, half while it
// waits.
func TestFaultEventSentTenTimesConcurrently(t *testing.T) {
	t.Parallel()
	const runs, senders = 6, 10
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	wf := eventUseFlow(recordIn(effects), nil)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: childAckWait}, wf)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: childAckWait}, wf)
	c := env.client()
	raw := env.conn()
	ctx := ctxT(t, 60*childAckWait)
	for r := range runs {
		id := fmt.Sprintf("evc-%d", r)
		h, err := Start(ctx, c, wf, r, WithRunID(id))
		require.NoError(t, err)
		if r%2 == 1 {
			require.Eventually(t, func() bool { return len(effects.Attempts(id+".prep.0")) == 1 }, 30*childAckWait, childAckWait/50)
		}
		ref := "R-" + id
		type answer struct {
			outcome, stepID string
			err             error
		}
		answers := make(chan answer, senders)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				if s%2 == 0 {
					res, err := c.SendEvent(ctx, id, "paid", "pay-"+id, json.RawMessage(`{"ref":"`+ref+`","amount":1}`))
					answers <- answer{string(res.Outcome), res.StepID, err}
					return
				}
				reply, err := rawEvent(ctx, raw, eventproto.Request{RunID: id, Name: "paid", EventID: "pay-" + id,
					Payload: json.RawMessage(`{ "amount": 1, "ref": "` + ref + `" }`)})
				if err == nil && reply.Error != nil {
					err = fmt.Errorf("%s: %s", reply.Error.Code, reply.Error.Message)
				}
				answers <- answer{reply.Outcome, reply.StepID, err}
			}()
		}
		close(gate)
		wg.Wait()
		close(answers)
		outcomes := map[string]int{}
		for a := range answers {
			require.NoError(t, a.err, id)
			require.Equal(t, id+".event=paid.0", a.stepID)
			outcomes[a.outcome]++
		}
		require.Equal(t, map[string]int{"delivered": 1, "duplicate": senders - 1}, outcomes, id)
		out, err := h.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, ref, out)
		require.Equal(t, []int{1}, effects.Attempts(id+".use.0"), "the step after the wait ran once")
		steps, err := stepsOf(ctx, c, id)
		require.NoError(t, err)
		require.Len(t, steps, 3, "prep, the event, use: no other wait took the event")
	}
}

// An event sent at about the moment its wait times out (WithTimeout):
// exactly one of the two ends the wait. The sender is told delivered into
// that wait when the event won, and into the next wait for the event when
// the timeout won; the worker is then SIGKILLed and the new one's replay
// decides the race the same way (the workflow fails otherwise).
func TestFaultEventRacingWaitTimeoutReplayed(t *testing.T) {
	t.Parallel()
	raceReplayedAfterKill(t, timeoutRaceFlow(nil), func(t *testing.T, id string, sent EventResult, winner string, steps map[string]StepRecord) {
		wait := steps["event=ping.0"]
		switch sent.StepID {
		case id + ".event=ping.0":
			require.Equal(t, "ev-"+id, winner, "%s: the sender was told its event ended the wait", id)
			require.Equal(t, "ping-"+id, wait.EventID)
		case id + ".event=ping.1":
			require.Equal(t, raceTimedOut, winner, "%s: the event went to the next wait", id)
			require.Empty(t, wait.EventID)
			require.Contains(t, wait.Error, "no event ping within")
			require.Equal(t, "ping-"+id, steps["event=ping.1"].EventID)
		default:
			t.Fatalf("%s: the event went to %s", id, sent.StepID)
		}
	})
}

// OnEvent raced against Timer with AwaitFirst, the event sent at about the
// timer's deadline: the workflow records the winner in a step, the worker
// is SIGKILLed, and the new worker's replay picks the same winner. The
// event goes to the one wait, won or lost.
func TestFaultAwaitFirstEventOrTimerReplayed(t *testing.T) {
	t.Parallel()
	raceReplayedAfterKill(t, firstRaceFlow(nil), func(t *testing.T, id string, sent EventResult, winner string, steps map[string]StepRecord) {
		require.Equal(t, id+".event=ping.0", sent.StepID)
		require.Equal(t, "ping-"+id, steps["event=ping.0"].EventID)
		if winner == raceTimedOut {
			require.Equal(t, "sleep", steps["alarm.0"].Kind, "%s: the timer won without its record", id)
		} else {
			require.Equal(t, "ev-"+id, winner)
		}
	})
}

// raceReplayedAfterKill runs races of wf (a raceFlow whose race lasts one
// AckWait) on a worker process: for each run it sends the event "ping" at
// moments spread around the race's deadline, waits until every run has
// recorded its winner and waits for "fin", SIGKILLs the worker, and lets a
// new one replay every run to its end. check gets each run's answer to the
// send, the winner its final replay computed, and its steps by name.
func raceReplayedAfterKill(t *testing.T, wf *Workflow[time.Duration, string], check func(t *testing.T, id string, sent EventResult, winner string, steps map[string]StepRecord)) {
	const runs = 12
	race := childAckWait // the timeout, or the timer
	env := newEnv(t, Topology{})
	effects, url := effectsServer(t)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)
	victim := startChild(t, env, "", url)
	require.NoError(t, waitReady(victim, 30*childAckWait))
	ctx := ctxT(t, 60*childAckWait)

	sent := make([]EventResult, runs)
	sentAt := make([]time.Duration, runs) // after "armed" committed
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := range runs {
		id := fmt.Sprintf("%s-%d", wf.Name(), i)
		_, err := Start(ctx, c, wf, race, WithRunID(id))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var armed time.Time
			for armed.IsZero() && ctx.Err() == nil {
				steps, err := stepsOf(ctx, c, id)
				if err == nil {
					armed = steps["armed.0"].CommittedAt
				}
				if armed.IsZero() {
					select {
					case <-ctx.Done():
					case <-time.After(childAckWait / 50):
					}
				}
			}
			// The race starts just after "armed" commits, and its
			// deadline fires up to a second after it is due (the NATS
			// server runs message schedules on whole seconds): the
			// sends are spread from a tenth of the race before the
			// deadline to two races after it.
			at := armed.Add(race*9/10 + (race*21/10)*time.Duration(i)/(runs-1))
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(at)):
			}
			sentAt[i] = time.Now().Sub(armed)
			sent[i], errs[i] = c.SendEvent(ctx, id, "ping", "ping-"+id, json.RawMessage(`"ev-`+id+`"`))
		}()
	}
	wg.Wait()
	for i := range runs {
		require.NoError(t, errs[i], "send %d", i)
		require.Equal(t, EventDelivered, sent[i].Outcome)
	}
	// Every race is decided and recorded; then the worker dies.
	require.Eventually(t, func() bool {
		for i := range runs {
			if len(effects.Attempts(fmt.Sprintf("%s-%d.saw.0", wf.Name(), i))) == 0 {
				return false
			}
		}
		return true
	}, 30*childAckWait, childAckWait/50)
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	_ = victim.Wait()
	next := startChild(t, env, "", url)
	require.NoError(t, waitReady(next, 30*childAckWait))

	won := map[string]int{}
	for i := range runs {
		id := fmt.Sprintf("%s-%d", wf.Name(), i)
		_, err := c.SendEvent(ctx, id, "fin", "fin-"+id, json.RawMessage(`"done"`))
		require.NoError(t, err)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
		var winner string
		require.NoError(t, json.Unmarshal(run.Output, &winner))
		steps, err := stepsOf(ctx, c, id)
		require.NoError(t, err)
		check(t, id, sent[i], winner, steps)
		t.Logf("%s: event sent %s after the race began, won by %s", id, sentAt[i].Round(time.Millisecond), winner)
		if winner == raceTimedOut {
			won["timeout"]++
		} else {
			won["event"]++
		}
	}
	noRewrites(t, c, writes)
	t.Logf("%d races, replayed after a SIGKILL: won by %v", runs, won)
}

// A run is cancelled (Client.CancelRun) while it sleeps: its wake-up, when
// the timer fires, does not run the step after the sleep, and an event
// sent to it is refused with ErrRunEnded (run_ended, with the run's
// status, over NATS). A run sleeping one AckWait longer next to it, not
// cancelled, wakes and completes: by then the cancelled run's timer has
// fired, and once the step tasks are all settled its wake-up has been
// handled.
func TestFaultCancelDuringSleep(t *testing.T) {
	t.Parallel()
	const ackWait = childAckWait
	nap := 2 * ackWait
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	wf := napFlow(recordIn(effects))
	env.worker(WorkerConfig{Concurrency: 4, AckWait: ackWait}, wf)
	c := env.client()
	ctx := ctxT(t, nap+30*ackWait)

	_, err := Start(ctx, c, wf, nap, WithRunID("cn-1"))
	require.NoError(t, err)
	control, err := Start(ctx, c, wf, nap+ackWait, WithRunID("cn-ctl"))
	require.NoError(t, err)
	sleeping := func() bool {
		ok, err := jetstream.HasTimer(ctx, c.assets.Timers, jetstream.RunTimer(wf.Name(), "cn-1.nap.0"), false)
		require.NoError(t, err)
		return ok
	}
	require.Eventually(t, sleeping, 10*ackWait, ackWait/50, "the sleep's timer was never stored")
	out, err := c.CancelRun(ctx, "cn-1")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, out.Status)

	_, err = control.Result(ctx)
	require.NoError(t, err)
	require.False(t, sleeping(), "the cancelled run's timer has not fired before the later one's")
	// Every task delivered so far, the cancelled run's wake-up among
	// them, has been settled.
	for _, kind := range []jetstream.TaskKind{jetstream.RunTasks, jetstream.BranchTasks} {
		cons, err := c.assets.JS.Consumer(ctx, jetstream.TasksStream, jetstream.ConsumerName(wf.Name(), kind))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, 10*ackWait, ackWait/50, "the tasks were not settled")
	}
	run, err := c.GetRun(ctx, "cn-1")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, run.Status)
	require.Equal(t, []int{1}, effects.Attempts("cn-1.before.0"))
	require.Empty(t, effects.Attempts("cn-1.after.0"), "the wake-up of a cancelled run ran its next step")
	steps, err := stepsOf(ctx, c, "cn-1")
	require.NoError(t, err)
	require.NotContains(t, steps, "after.0")
	t.Logf("cancelled run's steps after its wake-up: %d (the sleep's end committed: %t)", len(steps), steps["nap.0"].StepID != "")

	_, err = c.SendEvent(ctx, "cn-1", "poke", "poke-1", json.RawMessage(`"hello"`))
	require.ErrorIs(t, err, ErrRunEnded)
	reply, err := rawEvent(ctx, env.conn(), eventproto.Request{RunID: "cn-1", Name: "poke", EventID: "poke-2", Payload: json.RawMessage(`"hello"`)})
	require.NoError(t, err)
	require.NotNil(t, reply.Error)
	require.Equal(t, eventproto.CodeRunEnded, reply.Error.Code)
	require.Equal(t, StatusCancelled, RunStatus(reply.RunStatus))
	steps, err = stepsOf(ctx, c, "cn-1")
	require.NoError(t, err)
	require.NotContains(t, steps, "event=poke.0", "an event to an ended run was stored")
}

// Bad events for a waiting run, over the Go client and raw NATS: too
// large, an invalid hook token, event name, event ID or run ID, a payload
// that is not JSON or does not decode into the declared type, an
// undeclared event name, an unknown request field. Each gets its typed
// error (its code over NATS), stores nothing, and leaves the run waiting:
// a good event afterwards, under the event ID a bad payload used, is
// delivered, and the run completes with it.
func TestFaultBadEventsLeaveTheRunWaiting(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	wf := eventUseFlow(recordIn(effects), nil)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: childAckWait}, wf)
	c := env.client()
	raw := env.conn()
	ctx := ctxT(t, 60*childAckWait)
	h, err := Start(ctx, c, wf, 0, WithRunID("bad-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(effects.Attempts("bad-1.prep.0")) == 1 }, 30*childAckWait, childAckWait/50)

	good := json.RawMessage(`{"ref":"G-1","amount":3}`)
	huge := json.RawMessage(`"` + strings.Repeat("x", state.MaxInputBytes) + `"`)
	for _, tc := range []struct {
		name    string
		send    func() (EventResult, error)
		want    error
		req     any // the same over NATS
		rawCode string
	}{
		{"too large", func() (EventResult, error) { return c.SendEvent(ctx, "bad-1", "paid", "pay-1", huge) }, ErrInputTooLarge,
			eventproto.Request{RunID: "bad-1", Name: "paid", EventID: "pay-1", Payload: huge}, eventproto.CodeTooLarge},
		{"invalid token", func() (EventResult, error) { return c.Resume(ctx, "no spaces", "pay-1", good) }, ErrInvalidHookToken,
			eventproto.Request{Token: "no spaces", EventID: "pay-1", Payload: good}, eventproto.CodeInvalidToken},
		{"invalid name", func() (EventResult, error) { return c.SendEvent(ctx, "bad-1", "pa.id", "pay-1", good) }, ErrInvalidName,
			eventproto.Request{RunID: "bad-1", Name: "pa.id", EventID: "pay-1", Payload: good}, eventproto.CodeInvalidName},
		{"empty event ID", func() (EventResult, error) { return c.SendEvent(ctx, "bad-1", "paid", "", good) }, ErrInvalidEventID,
			eventproto.Request{RunID: "bad-1", Name: "paid", EventID: "", Payload: good}, eventproto.CodeInvalidEventID},
		{"control character in event ID", func() (EventResult, error) { return c.SendEvent(ctx, "bad-1", "paid", "pay\x01", good) }, ErrInvalidEventID,
			eventproto.Request{RunID: "bad-1", Name: "paid", EventID: "pay\x01", Payload: good}, eventproto.CodeInvalidEventID},
		{"invalid run ID", func() (EventResult, error) { return c.SendEvent(ctx, "bad 1", "paid", "pay-1", good) }, ErrInvalidRunID,
			eventproto.Request{RunID: "bad 1", Name: "paid", EventID: "pay-1", Payload: good}, eventproto.CodeInvalidRunID},
		{"payload of another type", func() (EventResult, error) {
			return c.SendEvent(ctx, "bad-1", "paid", "pay-1", json.RawMessage(`{"ref":5}`))
		}, ErrEventPayload,
			eventproto.Request{RunID: "bad-1", Name: "paid", EventID: "pay-1", Payload: json.RawMessage(`["G-1"]`)}, eventproto.CodeInvalidPayload},
		{"payload not JSON; over NATS, an unknown field", func() (EventResult, error) {
			return c.SendEvent(ctx, "bad-1", "paid", "pay-1", json.RawMessage(`{"ref":`))
		}, ErrEventPayload,
			map[string]any{"run_id": "bad-1", "name": "paid", "event_id": "pay-1", "payload": json.RawMessage(`"G-1"`), "extra": 1}, eventproto.CodeMalformed},
		{"undeclared event", func() (EventResult, error) { return c.SendEvent(ctx, "bad-1", "shipped", "pay-1", good) }, ErrUnknownEvent,
			eventproto.Request{RunID: "bad-1", Name: "shipped", EventID: "pay-1", Payload: good}, eventproto.CodeUnknownEvent},
	} {
		res, err := tc.send()
		require.ErrorIs(t, err, tc.want, tc.name)
		require.Empty(t, res.Outcome, tc.name)
		reply, err := rawEvent(ctx, raw, tc.req)
		require.NoError(t, err, tc.name)
		require.NotNil(t, reply.Error, tc.name)
		require.Equal(t, tc.rawCode, reply.Error.Code, "%s: %s", tc.name, reply.Error.Message)
		require.NotEmpty(t, reply.Error.Message, tc.name)
		require.Empty(t, reply.Outcome, tc.name)
	}
	// A request body that is not JSON at all.
	msg, err := raw.RequestWithContext(ctx, eventproto.SendSubject, []byte(`{"run_id":`))
	require.NoError(t, err)
	var reply eventproto.Reply
	require.NoError(t, json.Unmarshal(msg.Data, &reply))
	require.NotNil(t, reply.Error)
	require.Equal(t, eventproto.CodeMalformed, reply.Error.Code)

	steps, err := stepsOf(ctx, c, "bad-1")
	require.NoError(t, err)
	require.Len(t, steps, 1, "a refused event stored something: %v", steps)
	run, err := c.GetRun(ctx, "bad-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)

	res, err := c.SendEvent(ctx, "bad-1", "paid", "pay-1", good)
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	require.Equal(t, "bad-1.event=paid.0", res.StepID)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "G-1", out)
	require.Equal(t, []int{1}, effects.Attempts("bad-1.use.0"))
}
