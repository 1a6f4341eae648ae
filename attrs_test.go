package jetflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/startproto"
)

// walkAll lists every page of opts (at opts.Limit) and returns the runs in
// order, failing t if a run shows twice in the walk.
func walkAll(t *testing.T, c *Client, opts ListOptions) []Run {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	var out []Run
	seen := map[string]bool{}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10_000, "paging must end")
		page, err := c.ListRuns(ctx, opts)
		require.NoError(t, err)
		for _, r := range page.Runs {
			require.False(t, seen[r.RunID], "run %s listed twice in one walk", r.RunID)
			seen[r.RunID] = true
			out = append(out, r)
		}
		if page.Next == "" {
			return out
		}
		opts.After = page.Next
	}
}

// TestAttributeQueryFindsExactlyItsRuns: of 2,000 runs (10,000 with
// JETFLOW_FAULT_FULL set: under the race detector a walk of those takes
// about 45 s on two cores, a tenth of go test's default timeout) started with
// attributes, the 5% that share an order_id are exactly what a query by
// that attribute lists, newest first, page after page, while runs of
// another workflow (half of them with the same order_id) are started,
// end and expire; combined with workflow, status and a second attribute
// the query keeps only the runs whose records pass every filter, and a
// run whose record expired is never listed.
func TestAttributeQueryFindsExactlyItsRuns(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: time.Second})
	// "orders" has no worker: its runs stay running, in the order they
	// were started. "fleeting" runs end at once and expire a second later.
	orders := NewWorkflow("orders", func(ctx *Context, in int) (int, error) { return in, nil })
	fleeting := NewWorkflow("fleeting", func(ctx *Context, in int) (int, error) { return in, nil }, WithRetention(time.Second))
	env.worker(WorkerConfig{}, fleeting)
	c := env.client()
	ctx := ctxT(t, 10*time.Minute)

	runs := faultScale(2_000, 10_000)
	const share = 20 // one run in 20 (5%) has order_id 42
	attrsOf := func(i int) map[string]string {
		order := fmt.Sprintf("o-%d", i)
		if i%share == 0 {
			order = "42"
		}
		return map[string]string{"order_id": order, "customer": fmt.Sprintf("c-%d", i%7), "region": "eu west"}
	}
	// Batches of share runs at once, one of them sharing the order_id; a
	// batch begins when the last one is stored, so the shared runs have
	// an order: the newest is the last started.
	var shared []string // newest first
	began := time.Now()
	for b := 0; b < runs/share; b++ {
		g, gctx := errgroup.WithContext(ctx)
		for i := b * share; i < (b+1)*share; i++ {
			g.Go(func() error {
				_, err := Start(gctx, c, orders, i, WithRunID(fmt.Sprintf("ord-%05d", i)), WithAttributes(attrsOf(i)))
				return err
			})
		}
		require.NoError(t, g.Wait())
		shared = slices.Insert(shared, 0, fmt.Sprintf("ord-%05d", b*share))
	}
	require.Len(t, shared, runs/20)
	t.Logf("%d runs started in %s", runs, time.Since(began).Round(time.Millisecond))

	// Churn until the walks are done: fleeting runs, every other one
	// with order_id 42, start, complete and expire.
	defer churn(func(i int) bool {
		attrs := map[string]string{"order_id": fmt.Sprintf("f-%d", i)}
		if i%2 == 0 {
			attrs["order_id"] = "42"
		}
		_, err := Start(ctx, c, fleeting, i, WithRunID(fmt.Sprintf("fleet-%05d", i)), WithAttributes(attrs))
		// A start that stalls for longer than the run lives is told to
		// start again (ErrRetryStart): the churn goes on with the next.
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrRetryStart) {
			t.Errorf("start fleet-%05d: %v", i, err)
			return false
		}
		return true
	})()

	expired := func() bool {
		_, err := c.GetRun(ctx, "fleet-00000")
		return errors.Is(err, ErrRunNotFound)
	}
	byOrder := map[string]string{"order_id": "42"}
	for walks := 0; walks < 2 || !expired(); walks++ {
		require.NoError(t, ctx.Err(), "no fleeting run expired")
		walkBegan := time.Now()
		require.Equal(t, shared, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder, Workflow: "orders", Limit: 37})), "walk %d", walks)

		// Without the workflow: the same runs in the same order, among
		// fleeting ones that have the order_id.
		var ordersListed []string
		for _, r := range walkAll(t, c, ListOptions{Attributes: byOrder, Limit: 50}) {
			require.Equal(t, "42", r.Attributes["order_id"], "run %s", r.RunID)
			if r.Workflow == "orders" {
				ordersListed = append(ordersListed, r.RunID)
			}
		}
		require.Equal(t, shared, ordersListed, "walk %d", walks)
		t.Logf("walk %d: %s", walks, time.Since(walkBegan).Round(time.Millisecond))
	}
	// A run whose record expired is not listed (its entries expire with
	// it, or the listing that meets one leaves it out and removes it).
	require.NotContains(t, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder, Workflow: "fleeting", Limit: 100})), "fleet-00000")

	// Status: only the fleeting runs have ended.
	for _, r := range walkAll(t, c, ListOptions{Attributes: byOrder, Status: StatusCompleted, Limit: 100}) {
		require.Equal(t, "fleeting", r.Workflow)
		require.Equal(t, StatusCompleted, r.Status)
	}
	// Two attributes: the shared runs of customer c-3, checked on the
	// record.
	var want []string
	for _, id := range shared {
		var i int
		_, err := fmt.Sscanf(id, "ord-%05d", &i)
		require.NoError(t, err)
		if i%7 == 3 {
			want = append(want, id)
		}
	}
	require.NotEmpty(t, want)
	twoBegan := time.Now()
	got := walkAll(t, c, ListOptions{Attributes: map[string]string{"order_id": "42", "customer": "c-3"}, Limit: 20})
	t.Logf("two attributes: %s", time.Since(twoBegan).Round(time.Millisecond))
	require.Equal(t, want, runIDs(got))
	require.Equal(t, attrsOf(0)["region"], got[0].Attributes["region"], "a value with a space is stored as given")
	// An attribute no run has: an empty page.
	none, err := c.ListRuns(ctx, ListOptions{Attributes: map[string]string{"order_id": "43"}})
	require.NoError(t, err)
	require.Empty(t, none.Runs)
	require.Empty(t, none.Next)
}

// TestBadAttributesStoreNothing: a start with too many attributes, a name
// outside [a-z][a-z0-9_]{0,31}, or a value empty, too long or unprintable
// gets ErrInvalidAttributes naming the attribute — in process, by request
// to a worker, and as a NATS envelope — and stores nothing: no run record,
// no start task, no index entry. A listing by a bad attribute name is
// refused the same way.
func TestBadAttributesStoreNothing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("attributed", func(ctx *Context, in int) (int, error) { return in, nil })
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	nine := map[string]string{}
	for i := range 9 {
		nine[fmt.Sprintf("a%d", i)] = "v"
	}
	cases := []struct {
		name  string
		attrs map[string]string
		names string // what the error names
	}{
		{"too many", nine, "9 attributes, limit 8"},
		{"upper case name", map[string]string{"Order": "1"}, `"Order"`},
		{"digit first", map[string]string{"1st": "1"}, `"1st"`},
		{"dot in name", map[string]string{"order.id": "1"}, `"order.id"`},
		{"empty name", map[string]string{"": "1"}, `""`},
		{"long name", map[string]string{"a" + strings.Repeat("b", 32): "1"}, "abbb"},
		{"empty value", map[string]string{"order_id": ""}, "order_id: empty value"},
		{"long value", map[string]string{"order_id": strings.Repeat("4", 65)}, "order_id: value is 65 bytes, limit 64"},
		{"control character", map[string]string{"order_id": "4\n2"}, "order_id: value holds the unprintable character U+000A"},
		{"not UTF-8", map[string]string{"order_id": "\xff"}, "order_id: value is not UTF-8"},
	}
	check := func(t *testing.T, err error, names string) {
		t.Helper()
		require.ErrorIs(t, err, ErrInvalidAttributes)
		require.Contains(t, err.Error(), names)
	}
	for _, tc := range cases {
		_, err := Start(ctx, c, wf, 1, WithRunID("bad-1"), WithAttributes(tc.attrs))
		check(t, err, tc.names)
		_, err = c.StartByName(ctx, "attributed", json.RawMessage(`1`), WithRunID("bad-1"), WithAttributes(tc.attrs))
		check(t, err, tc.names)
		_, err = c.ListRuns(ctx, ListOptions{Attributes: tc.attrs})
		require.ErrorIs(t, err, ErrInvalidListOptions, tc.name)
		check(t, err, tc.names)
	}
	// The worker checks an envelope's attributes too (a client of any
	// language), with its own error code.
	env.worker(WorkerConfig{}, wf)
	for _, tc := range cases {
		if tc.name == "not UTF-8" {
			continue // JSON carries no invalid UTF-8: encoding/json makes it U+FFFD
		}
		body, err := json.Marshal(map[string]any{"run_id": "bad-1", "input": 1, "attributes": tc.attrs})
		require.NoError(t, err)
		msg, err := env.conn().RequestWithContext(ctx, startproto.AdmitSubjectPrefix+"attributed", body)
		require.NoError(t, err)
		var reply startproto.StartReply
		require.NoError(t, json.Unmarshal(msg.Data, &reply))
		require.NotNil(t, reply.Error, tc.name)
		require.Equal(t, startproto.CodeBadAttrs, reply.Error.Code, tc.name)
		require.Contains(t, reply.Error.Message, tc.names, tc.name)
	}

	_, err := c.GetRun(ctx, "bad-1")
	require.ErrorIs(t, err, ErrRunNotFound)
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	for stream, filter := range map[string]string{jetstream.TasksStream: "jetflow.task.>", jetstream.IndexStream: "jetflow.runindex.>"} {
		s, err := js.Stream(ctx, stream)
		require.NoError(t, err)
		info, err := s.Info(ctx, natsjs.WithSubjectFilter(filter))
		require.NoError(t, err)
		for subject := range info.State.Subjects {
			require.NotContains(t, subject, "bad-1", "stream %s", stream)
			require.NotContains(t, strings.ReplaceAll(subject, ".", ""), "bad-1", "stream %s", stream)
		}
	}

	// The limits themselves are accepted.
	eight := map[string]string{}
	for i := range 8 {
		eight[fmt.Sprintf("a%d", i)] = strings.Repeat("é", 32) // 64 bytes
	}
	eight["z"+strings.Repeat("9", 31)] = "x"
	delete(eight, "a7")
	h, err := Start(ctx, c, wf, 1, WithRunID("good-1"), WithAttributes(eight))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	run, err := c.GetRun(ctx, "good-1")
	require.NoError(t, err)
	require.Equal(t, eight, run.Attributes)
}

// TestAttributesAreTheFirstStarts: attributes are metadata, not part of
// the input's fingerprint — a duplicate start with other attributes is an
// ordinary duplicate, and the run keeps the first start's attributes (it
// is listed by them, not by the duplicate's) through its end.
func TestAttributesAreTheFirstStarts(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("firstwins", func(ctx *Context, in int) (int, error) { return in, nil })
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, wf, 1, WithRunID("fw-1"), WithAttributes(map[string]string{"order_id": "1"}))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	h, err = Start(ctx, c, wf, 1, WithRunID("fw-1"), WithAttributes(map[string]string{"order_id": "2"}))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, h.Outcome)
	env.worker(WorkerConfig{}, wf)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	awaitIndexed(t, c, "fw-1", StatusCompleted)
	run, err := c.GetRun(ctx, "fw-1")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"order_id": "1"}, run.Attributes)
	for value, want := range map[string][]string{"1": {"fw-1"}, "2": {}} {
		page, err := c.ListRuns(ctx, ListOptions{Attributes: map[string]string{"order_id": value}, Status: StatusCompleted})
		require.NoError(t, err)
		require.Equal(t, want, runIDs(page.Runs), "order_id %s", value)
	}
	// The ended run's attribute entry carries the run's expiry, like its
	// own entry, and it is the only one left of the attribute.
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	s, err := js.Stream(ctx, jetstream.IndexStream)
	require.NoError(t, err)
	info, err := s.Info(ctx, natsjs.WithSubjectFilter("jetflow.runindex.a.order_id.>"))
	require.NoError(t, err)
	require.Len(t, info.State.Subjects, 1)
	for subject, n := range info.State.Subjects {
		require.Equal(t, uint64(1), n, "the running entry was replaced")
		m, err := s.GetLastMsgForSubject(ctx, subject)
		require.NoError(t, err)
		require.NotEmpty(t, m.Header.Get(natsjs.MsgTTLHeader), "an ended run's attribute entry expires")
	}
}

// TestAttributeEntriesRebuilt: a run index deleted by hand is rebuilt with
// the attribute entries of every kept run, running and ended, from the run
// records: the next listing by attribute finds them again.
func TestAttributeEntriesRebuilt(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rebuilt", func(ctx *Context, in int) (int, error) { return in, nil })
	held := NewWorkflow("held", func(ctx *Context, in int) (int, error) { return in, nil }) // no worker: stays running
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	byOrder := map[string]string{"order_id": "9"}
	for _, id := range []string{"rb-1", "rb-2"} {
		h, err := Start(ctx, c, wf, 1, WithRunID(id), WithAttributes(byOrder))
		require.NoError(t, err)
		_, err = h.Result(ctx)
		require.NoError(t, err)
		awaitIndexed(t, c, id, StatusCompleted)
	}
	_, err := Start(ctx, c, held, 1, WithRunID("rb-3"), WithAttributes(byOrder))
	require.NoError(t, err)
	_, err = Start(ctx, c, held, 1, WithRunID("rb-other"), WithAttributes(map[string]string{"order_id": "10"}))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"rb-1", "rb-2", "rb-3"}, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder})))

	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(ctx, jetstream.IndexStream))
	require.ElementsMatch(t, []string{"rb-1", "rb-2", "rb-3"}, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder})))
	require.Equal(t, []string{"rb-3"}, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder, Status: StatusRunning})))
	require.ElementsMatch(t, []string{"rb-1", "rb-2"}, runIDs(walkAll(t, c, ListOptions{Attributes: byOrder, Workflow: "rebuilt"})))
}
