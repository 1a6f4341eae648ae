package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type order struct {
	ID    string   `json:"id"`
	Items []string `json:"items"`
	Total int      `json:"total"`
}

// G4: the run keeps a canonical fingerprint of workflow and input. The same
// input with reordered keys and other white space is a duplicate; another
// input is a conflict in strict mode (the default) and a duplicate in ignore
// mode; the stored run is never changed. The fingerprint survives the run's
// completion, so the answer is the same before and after.
func TestFingerprintDecidesDuplicateOrConflict(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	release := make(chan struct{})
	wf := NewWorkflow("fp-order", func(ctx *Context, in order) (int, error) {
		return Step(ctx, "total", func(context.Context) (int, error) {
			<-release
			return in.Total, nil
		})
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := c.StartByName(ctx, "fp-order", json.RawMessage(`{"id":"o-1","items":["a","b"],"total":3}`), WithRunID("fp-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)

	check := func(when string) {
		// Same value, keys reordered, other spacing: a duplicate.
		res, err := c.StartByName(ctx, "fp-order", json.RawMessage(" {\"total\": 3, \"items\": [\"a\", \"b\"],\n \"id\": \"o-1\"} "), WithRunID("fp-1"))
		require.NoError(t, err, when)
		require.Equal(t, OutcomeExisting, res.Outcome, when)
		hd, err := Start(ctx, c, wf, order{ID: "o-1", Items: []string{"a", "b"}, Total: 3}, WithRunID("fp-1"))
		require.NoError(t, err, when)
		require.Equal(t, OutcomeExisting, hd.Outcome, when)

		// Another input: a conflict naming the run and the part that differs.
		_, err = Start(ctx, c, wf, order{ID: "o-1", Items: []string{"a"}, Total: 3}, WithRunID("fp-1"))
		require.ErrorIs(t, err, ErrIdempotencyConflict, when)
		var ce *ConflictError
		require.ErrorAs(t, err, &ce, when)
		require.Equal(t, "fp-1", ce.RunID)
		require.Equal(t, "input", ce.Field)
		_, err = c.StartByName(ctx, "fp-order", json.RawMessage(`{"id":"o-1","items":["b","a"],"total":3}`), WithRunID("fp-1"))
		require.ErrorIs(t, err, ErrIdempotencyConflict, when+": array order matters")

		// Ignore mode: the same start is an ordinary duplicate.
		hi, err := Start(ctx, c, wf, order{ID: "o-1", Total: 4}, WithRunID("fp-1"), WithFingerprintMode(FingerprintIgnore))
		require.NoError(t, err, when)
		require.Equal(t, OutcomeExisting, hi.Outcome, when)
	}
	check("while running")
	close(release)
	run, err := c.WaitRun(ctx, "fp-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	check("after completion")

	run, err = c.GetRun(ctx, "fp-1")
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"o-1","items":["a","b"],"total":3}`, string(run.Input), "the stored input is kept")
	require.JSONEq(t, `3`, string(run.Output))
}

// A conflict on the input names the top-level fields that differ, with
// how each changed, and never a value: in the error's text and in
// ConflictError.Fields, the same from Start (admitted in process) and
// StartByName (a worker's reply). An input that is not an object is
// said to differ, with no fields.
func TestConflictNamesTheFieldsThatDiffer(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	obj := NewWorkflow("cf-obj", func(ctx *Context, in map[string]any) (int, error) { return len(in), nil })
	num := NewWorkflow("cf-num", func(ctx *Context, in int) (int, error) { return in, nil })
	env.worker(WorkerConfig{}, obj, num)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	_, err := c.StartByName(ctx, "cf-obj", json.RawMessage(`{"amount":100,"card":"4242-secret","note":"hello-note","id":"o-1"}`), WithRunID("cf-1"))
	require.NoError(t, err)

	want := []FieldDiff{{Name: "amount", Change: FieldChanged}, {Name: "coupon", Change: FieldAdded}, {Name: "note", Change: FieldRemoved}}
	const text = `: input fields differ: "amount" (changed), "coupon" (added), "note" (removed)`
	check := func(how string, err error) {
		t.Helper()
		var ce *ConflictError
		require.ErrorAs(t, err, &ce, how)
		require.ErrorIs(t, err, ErrIdempotencyConflict, how)
		require.Equal(t, "cf-1", ce.RunID, how)
		require.Equal(t, "input", ce.Field, how)
		require.Equal(t, want, ce.Fields, how)
		require.Zero(t, ce.MoreFields, how)
		require.True(t, strings.HasSuffix(err.Error(), text), "%s: %s", how, err)
		for _, v := range []string{"4242", "secret", "hello", "999", "SAVE10"} {
			require.NotContains(t, err.Error(), v, "%s: no value in the text", how)
		}
	}
	_, err = Start(ctx, c, obj, map[string]any{"amount": 999, "card": "4242-secret", "coupon": "SAVE10", "id": "o-1"}, WithRunID("cf-1"))
	check("Start", err)
	_, err = c.StartByName(ctx, "cf-obj", json.RawMessage(`{"id":"o-1","card":"4242-secret","amount":999,"coupon":"SAVE10"}`), WithRunID("cf-1"))
	check("StartByName", err)

	_, err = c.StartByName(ctx, "cf-num", json.RawMessage(`1`), WithRunID("cf-2"))
	require.NoError(t, err)
	_, err = c.StartByName(ctx, "cf-num", json.RawMessage(`2`), WithRunID("cf-2"))
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Empty(t, ce.Fields)
	require.True(t, strings.HasSuffix(err.Error(), ": input differs"), err.Error())

	// Another workflow: the workflows are named, no input fields.
	_, err = c.StartByName(ctx, "cf-num", json.RawMessage(`7`), WithRunID("cf-1"))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "workflow", ce.Field)
	require.Empty(t, ce.Fields)
}

// G10: every duplicate attempt is recorded on its run — when, from where,
// outcome, whether the fingerprint matched — bounded to the first and the
// most recent ones with a total count.
func TestDuplicateAuditOfARunStartedTenTimes(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := threeSteps("audited", newCounter())
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	h, err := Start(ctx, c, wf, 1, WithRunID("aud-1"), WithSource("webhook-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	for i := 2; i <= 10; i++ {
		input := 1
		if i == 5 {
			input = 2 // one attempt with another input: a conflict
		}
		h, err := Start(ctx, c, wf, input, WithRunID("aud-1"), WithSource(fmt.Sprintf("webhook-%d", i)))
		if i == 5 {
			require.ErrorIs(t, err, ErrIdempotencyConflict)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, int64(i-1), h.Duplicates, "the handle counts this duplicate")
	}
	run, err := c.GetRun(ctx, "aud-1")
	require.NoError(t, err)
	require.Equal(t, int64(9), run.Duplicates)
	require.NotNil(t, run.FirstDuplicate)
	require.Equal(t, "webhook-2", run.FirstDuplicate.Source)
	require.Len(t, run.RecentDuplicates, 9)
	for i, d := range run.RecentDuplicates {
		require.Equal(t, fmt.Sprintf("webhook-%d", i+2), d.Source)
		require.False(t, d.At.IsZero())
		if i+2 == 5 {
			require.Equal(t, "conflict", d.Outcome)
			require.False(t, d.FingerprintMatch)
		} else {
			require.Equal(t, "existing", d.Outcome)
			require.True(t, d.FingerprintMatch)
		}
	}

	// Bounded: 30 more keep the first, the last 10 and the count.
	for i := 11; i <= 40; i++ {
		_, err := Start(ctx, c, wf, 1, WithRunID("aud-1"), WithSource(fmt.Sprintf("webhook-%d", i)))
		require.NoError(t, err)
	}
	run, err = c.GetRun(ctx, "aud-1")
	require.NoError(t, err)
	require.Equal(t, int64(39), run.Duplicates)
	require.Equal(t, "webhook-2", run.FirstDuplicate.Source)
	require.Len(t, run.RecentDuplicates, 10)
	require.Equal(t, "webhook-31", run.RecentDuplicates[0].Source)
	require.Equal(t, "webhook-40", run.RecentDuplicates[9].Source)
}
