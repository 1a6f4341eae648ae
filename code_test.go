package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCodeStepFailureBranchesAfterReplay: a step that fails with a code
// (ErrorWithCode, with Fatal on either side, or retried until it runs out
// of attempts) reaches the workflow as a *StepError with that code, and the
// code is the same on later replays, where the step's error value no longer
// exists: the workflow branches on it, and a run that returns the failure
// reports the code to the caller on its *RunError.
func TestCodeStepFailureBranchesAfterReplay(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	var (
		mu   sync.Mutex
		seen []string // per execution of the body: what it branched on
	)
	wf := NewWorkflow("coded", func(ctx *Context, _ int) (string, error) {
		var got []string
		var last error
		for _, step := range []struct {
			name string
			err  error
			opts []StepOption
		}{
			{"fatal-outside", Fatal(ErrorWithCode("card_declined", errors.New("declined"))), nil},
			{"fatal-inside", ErrorWithCode("card_expired", Fatal(errors.New("expired"))), nil},
			{"exhausted", ErrorWithCode("rate_limited", RetryAfter(errors.New("429"), time.Millisecond)), []StepOption{WithMaxAttempts(2)}},
		} {
			_, err := Step(ctx, step.name, func(context.Context) (int, error) {
				effects.inc(step.name)
				return 0, step.err
			}, step.opts...)
			var se *StepError
			if !errors.As(err, &se) {
				return "", fmt.Errorf("step %s: want a *StepError, got %v", step.name, err)
			}
			var coded *CodedError
			if !errors.As(err, &coded) || coded.Code != se.Code {
				return "", fmt.Errorf("step %s: errors.As does not reach the code %q", step.name, se.Code)
			}
			switch se.Code { // the branch a workflow takes
			case "card_declined", "card_expired":
				got = append(got, fmt.Sprintf("%s=%s/fatal=%t/attempts=%d", step.name, se.Code, se.Fatal, se.Attempts))
			default:
				got = append(got, fmt.Sprintf("%s=retry-later(%s)/fatal=%t/attempts=%d", step.name, se.Code, se.Fatal, se.Attempts))
			}
			last = err
		}
		mu.Lock()
		seen = append(seen, strings.Join(got, " "))
		mu.Unlock()
		return "", fmt.Errorf("giving up: %w", last)
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("coded-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 30*time.Second))
	require.ErrorIs(t, err, ErrRunFailed)
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "step", re.Kind, "a returned *StepError still fails the run as a step failure")
	require.Equal(t, "rate_limited", re.Code)
	var coded *CodedError
	require.ErrorAs(t, err, &coded, "the caller reaches the code with errors.As too")
	require.Equal(t, "rate_limited", coded.Code)

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(seen), 1)
	require.Equal(t,
		"fatal-outside=card_declined/fatal=true/attempts=1 fatal-inside=card_expired/fatal=true/attempts=1 exhausted=retry-later(rate_limited)/fatal=false/attempts=2",
		seen[len(seen)-1], "the last execution replays the first two failures from their records")
	require.Equal(t, map[string]int{"fatal-outside": 1, "fatal-inside": 1, "exhausted": 2}, effects.snapshot())

	run, err := c.GetRun(ctxT(t, 5*time.Second), "coded-1")
	require.NoError(t, err)
	require.Equal(t, "rate_limited", run.Error.Code, "GetRun reports the stored code as well")
}

// TestCodeWorkflowErrorReachesCaller: a workflow that fails with its own
// coded error reports the code on the run (Kind "workflow").
func TestCodeWorkflowErrorReachesCaller(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("coded-wf", func(ctx *Context, n int) (int, error) {
		if n > 10 {
			return 0, ErrorWithCode("out_of_stock", fmt.Errorf("only 10 left, asked for %d", n))
		}
		return n, nil
	})
	env.worker(WorkerConfig{}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 11, WithRunID("coded-wf-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "workflow", re.Kind)
	require.Equal(t, "out_of_stock", re.Code)
	require.Contains(t, re.Message, "only 10 left")
}

// TestConflictPolicyInvalidValuesAreErrors: a conflict policy or
// fingerprint mode outside its constants makes a start fail with
// ErrInvalidConflictPolicy (StartByName used to panic encoding it), and
// stores nothing.
func TestConflictPolicyInvalidValuesAreErrors(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("policed", func(ctx *Context, n int) (int, error) { return n, nil })
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 20*time.Second)
	for i, opt := range []StartOption{
		WithConflictPolicy(ConflictPolicy{WhileRunning: 3}),
		WithConflictPolicy(ConflictPolicy{AfterCompleted: -1}),
		WithFingerprintMode(7),
	} {
		id := fmt.Sprintf("policed-%d", i)
		_, err := Start(ctx, c, wf, 1, WithRunID(id), opt)
		require.ErrorIs(t, err, ErrInvalidConflictPolicy, "Start, case %d", i)
		_, err = c.StartByName(ctx, "policed", json.RawMessage(`1`), WithRunID(id), opt)
		require.ErrorIs(t, err, ErrInvalidConflictPolicy, "StartByName, case %d", i)
		_, err = c.GetRun(ctx, id)
		require.ErrorIs(t, err, ErrRunNotFound, "case %d stored nothing", i)
	}
	unregistered := NewWorkflow("policed", func(ctx *Context, n int) (int, error) { return n, nil },
		WithDefaultConflictPolicy(ConflictPolicy{AfterFailed: 4}))
	_, err := Start(ctx, c, unregistered, 1, WithRunID("policed-default"))
	require.ErrorIs(t, err, ErrInvalidConflictPolicy, "a client checks the workflow's own default too")
}
