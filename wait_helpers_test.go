package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// The workflows of the wait fault tests (wait_fault_test.go). The child
// worker processes (child_test.go) serve them too, so that a test can
// SIGKILL the worker that runs them.
func init() {
	childExtras = append(childExtras, func(crash, effectsURL string, _ *WorkerConfig) []Registrable {
		report := reportTo(effectsURL)
		var beforeUse func(StepDetails)
		if crash == "mid-use" {
			// Dies in the first attempt of the step after the event, once
			// its side effect is logged: after the event was consumed,
			// before the step's commit.
			beforeUse = func(info StepDetails) {
				if info.Attempt == 1 {
					killSelf()
				}
			}
		}
		return []Registrable{napFlow(report), eventUseFlow(report, beforeUse), timeoutRaceFlow(report), firstRaceFlow(report)}
	})
}

// reportTo reports side effects to a faultcheck.Effects served at url.
func reportTo(url string) effectReporter {
	return func(ctx context.Context, info StepDetails) error { return reportEffect(ctx, url, info) }
}

// waitOrder is the payload of the "paid" event.
type waitOrder struct {
	Ref    string `json:"ref"`
	Amount int    `json:"amount"`
}

// clockStep is a step that reports its side effect and returns the time it
// ran.
func clockStep(ctx *Context, name string, report effectReporter) (time.Time, error) {
	return Step(ctx, name, reportedStep(report, time.Now), WithBackoff(50*time.Millisecond, 200*time.Millisecond))
}

// napFlow ("napper") runs step "before", sleeps its input ("nap"), runs
// step "after" and returns the time "after" ran. Both steps report their
// side effect; a completed run commits three steps.
func napFlow(report effectReporter) *Workflow[time.Duration, time.Time] {
	return NewWorkflow("napper", func(ctx *Context, d time.Duration) (time.Time, error) {
		if _, err := clockStep(ctx, "before", report); err != nil {
			return time.Time{}, err
		}
		if err := Sleep(ctx, "nap", d); err != nil {
			return time.Time{}, err
		}
		return clockStep(ctx, "after", report)
	}, WithEvent[string]("poke"))
}

// eventUseFlow ("evuse") runs step "prep", waits for the "paid" event and
// returns the order's ref from step "use", which reports its side effect
// under its step ID and under <step ID>|<ref> (the payload it saw).
// beforeUse, when set, runs in "use" after the report.
func eventUseFlow(report effectReporter, beforeUse func(StepDetails)) *Workflow[int, string] {
	return NewWorkflow("evuse", func(ctx *Context, _ int) (string, error) {
		if _, err := clockStep(ctx, "prep", report); err != nil {
			return "", err
		}
		order, err := WaitEvent[waitOrder](ctx, "paid")
		if err != nil {
			return "", err
		}
		return Step(ctx, "use", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			if err := report(sctx, info); err != nil {
				return "", err
			}
			seen := info
			seen.StepID += "|" + order.Ref
			if err := report(sctx, seen); err != nil {
				return "", err
			}
			if beforeUse != nil {
				beforeUse(info)
			}
			return order.Ref, nil
		}, WithBackoff(50*time.Millisecond, 200*time.Millisecond))
	}, WithEvent[waitOrder]("paid"))
}

// raceFlow runs step "armed" (the race's start), then race, which returns
// the race's winner as a string; it records the winner in step "saw", then
// waits for the event "fin" (where a test kills the worker). It returns
// the winner as the replay that ends the run computes it, and fails when
// that differs from the one "saw" recorded: a race decided otherwise on
// replay fails the run.
func raceFlow(name string, report effectReporter, race func(ctx *Context, d time.Duration) (string, error)) *Workflow[time.Duration, string] {
	return NewWorkflow(name, func(ctx *Context, d time.Duration) (string, error) {
		if _, err := clockStep(ctx, "armed", report); err != nil {
			return "", err
		}
		winner, err := race(ctx, d)
		if err != nil {
			return "", err
		}
		saw, err := Step(ctx, "saw", reportedStep(report, func() string { return winner }))
		if err != nil {
			return "", err
		}
		if _, err := WaitEvent[string](ctx, "fin"); err != nil {
			return "", err
		}
		if saw != winner {
			return "", fmt.Errorf("replay decided the race for %q, recorded %q", winner, saw)
		}
		return winner, nil
	}, WithEvent[string]("ping"), WithEvent[string]("fin"))
}

// raceTimedOut is the winner of a race that the timeout or timer won.
const raceTimedOut = "timeout"

// timeoutRaceFlow ("toracer") races the event "ping" against the wait's
// own timeout (WithTimeout(d)): the winner is the event's payload or
// raceTimedOut.
func timeoutRaceFlow(report effectReporter) *Workflow[time.Duration, string] {
	return raceFlow("toracer", report, func(ctx *Context, d time.Duration) (string, error) {
		v, err := WaitEvent[string](ctx, "ping", WithTimeout(d))
		if errors.Is(err, ErrEventTimeout) {
			return raceTimedOut, nil
		}
		return v, err
	})
}

// firstRaceFlow ("firstracer") races OnEvent("ping") against Timer("alarm",
// d) with AwaitFirst: the winner is the event's payload or raceTimedOut.
func firstRaceFlow(report effectReporter) *Workflow[time.Duration, string] {
	return raceFlow("firstracer", report, func(ctx *Context, d time.Duration) (string, error) {
		ev, alarm := OnEvent[string](ctx, "ping"), Timer(ctx, "alarm", d)
		i, err := AwaitFirst(ctx, ev, alarm)
		if err != nil {
			return "", err
		}
		if i == 1 {
			return raceTimedOut, nil
		}
		return ev.Get(ctx)
	})
}

// rawEvent sends req over the NATS event protocol, as a client in another
// language would, and returns the reply.
func rawEvent(ctx context.Context, nc *nats.Conn, req any) (eventproto.Reply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return eventproto.Reply{}, err
	}
	msg, err := nc.RequestWithContext(ctx, eventproto.SendSubject, b)
	if err != nil {
		return eventproto.Reply{}, err
	}
	var reply eventproto.Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return eventproto.Reply{}, fmt.Errorf("reply %q: %w", msg.Data, err)
	}
	return reply, nil
}

// envCount is the positive integer in the environment variable name, or
// def when it is unset.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, name)
	require.Positive(t, n, name)
	return n
}

// quantiles returns the p50, p90, p99 and max of ds.
func quantiles(ds []time.Duration) (p50, p90, p99, maxD time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.90), at(0.99), s[len(s)-1]
}

// waitRunRetrying is c.WaitRun retried while it fails with ErrUnavailable
// (the NATS server restarts, the client reconnects), as a caller would.
func waitRunRetrying(ctx context.Context, c *Client, runID string) (Run, error) {
	for {
		run, err := c.WaitRun(ctx, runID)
		if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return run, err
		}
		select {
		case <-ctx.Done():
			return run, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// noRewrites stops writes and fails t if a step record was written more
// than once: a wait's end or event, or a step's result, committed twice.
// (A faultcheck.Check of an empty ledger checks the writes alone: the
// waits' records hold no side effect for it to match.)
func noRewrites(t *testing.T, c *Client, writes *faultcheck.Writes) {
	t.Helper()
	v := faultcheck.Check(ctxT(t, 30*time.Second), c.assets, faultcheck.NewLedger(), faultcheck.NewEffects(), writes, 0, childAckWait)
	require.NoError(t, writes.Stop())
	require.True(t, v.OK(), v.String())
}

// stepsOf reads run's committed steps, by step ID without the run ID:
// "before.0", "event=ping.1".
func stepsOf(ctx context.Context, c *Client, runID string) (map[string]StepRecord, error) {
	steps, err := c.Steps(ctx, runID)
	if err != nil {
		return nil, err
	}
	out := make(map[string]StepRecord, len(steps))
	for _, s := range steps {
		out[strings.TrimPrefix(s.StepID, runID+".")] = s
	}
	return out, nil
}
