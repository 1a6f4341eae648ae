package dedupe

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/jetflowtype"
)

func setup(t *testing.T) *Admitter {
	t.Helper()
	nc := testenv.Conn(t, testenv.Server(t))
	a, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	return New(a, Config{})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// A create retried after a lost reply finds its own token and reports
// created; anyone else's create reports existing.
func TestCreateRetriedAfterLostReplyIsStillCreated(t *testing.T) {
	t.Parallel()
	a := setup(t)
	rec, err := a.newRecord(Request{RunID: "r-1", Workflow: "w", Input: json.RawMessage(`1`)}, "token-A")
	require.NoError(t, err)
	st, err := a.createOrRead(ctx(t), rec, starter{began: time.Now()})
	require.NoError(t, err)
	require.True(t, st.created)

	// The same call again (its first reply was lost).
	st, err = a.createOrRead(ctx(t), rec, starter{began: time.Now()})
	require.NoError(t, err)
	require.True(t, st.created, "own write recognised by its token")
	require.Equal(t, "token-A", st.run.Token)

	other, err := a.newRecord(Request{RunID: "r-1", Workflow: "w", Input: json.RawMessage(`2`)}, "token-B")
	require.NoError(t, err)
	st, err = a.createOrRead(ctx(t), other, starter{began: time.Now()})
	require.NoError(t, err)
	require.False(t, st.created)
	require.JSONEq(t, `1`, string(st.run.Input), "the first record is kept")
}

// A start whose publisher died after publishing the start task but before
// writing the record: the task's receiver materialises the record with the
// publisher's token, and a later start of the same ID is a duplicate.
func TestMaterializeCompletesAnInterruptedStart(t *testing.T) {
	t.Parallel()
	a := setup(t)
	task := state.Task{V: state.Version, RunID: "evt-9", Workflow: "w", Input: json.RawMessage(`{"x":1}`), Token: "dead-publisher"}
	run, rev, err := a.Materialize(ctx(t), task)
	require.NoError(t, err)
	require.NotZero(t, rev)
	require.Equal(t, "dead-publisher", run.Token)
	require.Equal(t, state.StatusRunning, run.Status)

	res, err := a.Admit(ctx(t), Request{RunID: "evt-9", Workflow: "w", Input: json.RawMessage(`{"x":1}`), Source: "retry"})
	require.NoError(t, err)
	require.Equal(t, Existing, res.Outcome)
	require.Equal(t, int64(1), res.Duplicates)

	// Materialising again (a redelivered start task) changes nothing.
	again, rev2, err := a.Materialize(ctx(t), task)
	require.NoError(t, err)
	require.Equal(t, rev, rev2)
	require.Equal(t, run.Token, again.Token)
}

// The start task carries the workflow's retention, so a record created by
// the worker that receives it (its publisher died, or was slower) keeps it.
func TestStartTaskCarriesRetention(t *testing.T) {
	t.Parallel()
	a := setup(t)
	_, err := a.Admit(ctx(t), Request{RunID: "keep-3s", Workflow: "w", Input: json.RawMessage(`1`), Retention: 3 * time.Second})
	require.NoError(t, err)
	m, err := a.assets.Tasks.GetLastMsgForSubject(ctx(t), jetstream.RunSubject("w", "keep-3s"))
	require.NoError(t, err)
	task, err := state.DecodeTask(m.Data)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, task.Retention)
}

// A run ID whose record expired: a start task published before that (a
// duplicate's, or the expired run's own) creates nothing when a worker
// materialises it. The start task of the run created over that marker,
// whose publisher died before replacing it, does: the worker finishes the
// replacement, and the starter, reading it back by its token, is told it
// created a run after expiry.
func TestAfterExpiryIsReportedWhoeverCreates(t *testing.T) {
	t.Parallel()
	nc := testenv.Conn(t, testenv.Server(t))
	assets, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{Retention: time.Second, DuplicateWindow: 500 * time.Millisecond}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	a := New(assets, Config{})
	_, err = a.Admit(ctx(t), Request{RunID: "exp-1", Workflow: "w", Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	end(t, a, "exp-1")
	var marker jetstream.KeyState
	require.Eventually(t, func() bool {
		marker, err = assets.Runs.Latest(context.Background(), "exp-1")
		return err == nil && marker.Rev > 0 && !marker.Live
	}, 20*time.Second, 50*time.Millisecond, "the record never expired into a marker")

	for _, stale := range []state.Task{
		{V: state.Version, RunID: "exp-1", Workflow: "w", Input: json.RawMessage(`2`), Token: "duplicate"},
		{V: state.Version, RunID: "exp-1", Workflow: "w", Input: json.RawMessage(`2`), Token: "other-marker",
			Generation: int(marker.Rev) + 1, AfterExpiry: true},
	} {
		_, _, err := a.Materialize(ctx(t), stale)
		require.ErrorIs(t, err, ErrStaleStart, "token %s", stale.Token)
	}
	st, err := assets.Runs.Latest(ctx(t), "exp-1")
	require.NoError(t, err)
	require.Equal(t, marker.Rev, st.Rev, "a stale start task wrote nothing")

	task := state.Task{V: state.Version, RunID: "exp-1", Workflow: "w", Input: json.RawMessage(`2`), Token: "starter",
		Generation: int(marker.Rev), AfterExpiry: true}
	run, _, err := a.Materialize(ctx(t), task)
	require.NoError(t, err)
	require.True(t, run.AfterExpiry)
	require.Equal(t, int(marker.Rev), run.Generation, "a new identity")
	require.Equal(t, "starter", run.Token)
	rec, err := a.newRecord(Request{RunID: "exp-1", Workflow: "w", Input: json.RawMessage(`2`)}, "starter")
	require.NoError(t, err)
	got, err := a.readOrCreate(ctx(t), rec, starter{began: time.Now()})
	require.NoError(t, err)
	require.True(t, got.created)
	require.True(t, got.afterExpiry, "the starter must be told the old run expired")
}

// end writes the end of the running run runID as a worker's finish does:
// completed, with the retention as the record's TTL (while it runs, the
// record never expires).
func end(t *testing.T, a *Admitter, runID string) {
	t.Helper()
	v, rev, err := a.assets.Runs.Get(ctx(t), runID)
	require.NoError(t, err)
	run, err := state.DecodeRun(v)
	require.NoError(t, err)
	require.Equal(t, state.StatusRunning, run.Status)
	run.Status, run.Output, run.UpdatedAt = state.StatusCompleted, json.RawMessage(`true`), time.Now().UTC()
	b, err := state.Encode(run)
	require.NoError(t, err)
	ttl := run.Retention
	if ttl == 0 {
		ttl = a.assets.Topology.Retention
	}
	_, err = a.assets.Runs.UpdateTTL(ctx(t), runID, b, rev, ttl)
	require.NoError(t, err)
}

// A superseding start whose new generation the receiver of its start task
// wrote for it, and a newer start superseded, before the start read the
// record back: it made that generation and says so (cancelled by now), and
// makes no other. Without the predecessors a record keeps, it took the
// newer generation for another start's and superseded it with a second
// generation of its own input.
func TestSupersedingStartFindsTheGenerationWrittenForIt(t *testing.T) {
	t.Parallel()
	a := setup(t)
	request := func(input string) Request { return supersedeRequest("s-1", input) }
	res, err := a.Admit(ctx(t), request(`0`))
	require.NoError(t, err)
	require.Equal(t, Created, res.Outcome)

	newer := false
	a.SetHooks(Hooks{AfterRestartPublished: func(runID string, gen int) {
		if gen != 1 {
			return // the newer start's own restart
		}
		// The worker receives generation 1's start task and writes it.
		m, err := a.assets.Tasks.GetLastMsgForSubject(ctx(t), jetstream.RunSubject("w", state.RunIdentity(runID, gen)))
		require.NoError(t, err)
		task, err := state.DecodeTask(m.Data)
		require.NoError(t, err)
		run, _, err := a.Materialize(ctx(t), task)
		require.NoError(t, err)
		require.Equal(t, 1, run.Generation)
		require.Equal(t, task.Token, run.Token)
		// A newer start supersedes it.
		res, err := a.Admit(ctx(t), request(`2`))
		require.NoError(t, err)
		require.Equal(t, Superseded, res.Outcome)
		require.Equal(t, 2, res.Run.Generation)
		newer = true
	}})
	res, err = a.Admit(ctx(t), request(`1`))
	require.NoError(t, err)
	require.True(t, newer)
	require.Equal(t, Superseded, res.Outcome)
	require.Equal(t, 1, res.Run.Generation, "the generation written for it")
	require.Equal(t, state.StatusCancelled, res.Run.Status, "and superseded since")

	run, _, err := a.runs.Get(ctx(t), "s-1")
	require.NoError(t, err)
	require.Equal(t, 2, run.Generation, "no generation after the newer start's")
	require.JSONEq(t, `2`, string(run.Input))
	require.Equal(t, []string{"superseded@2", "superseded@1"}, auditOutcomes(t, a, "s-1"))
}

// auditOutcomes are the outcomes the audit of runID holds, as
// outcome@generation, oldest first.
func auditOutcomes(t *testing.T, a *Admitter, runID string) []string {
	t.Helper()
	au, err := a.runs.Audit(ctx(t), runID)
	require.NoError(t, err)
	var out []string
	for _, e := range au.Recent {
		out = append(out, fmt.Sprintf("%s@%d", e.Outcome, e.Generation))
	}
	return out
}

// A superseding start that loses every round to other superseding starts
// (each supersedes the generation it would have replaced, just before it)
// gives up after maxSupersedeRounds with a retryable ErrUnavailable: it
// started nothing, and is not told its input runs. Each rival's start
// made one generation.
func TestSupersedingStartThatKeepsLosingIsUnavailable(t *testing.T) {
	t.Parallel()
	a := setup(t)
	_, err := a.Admit(ctx(t), supersedeRequest("s-2", `0`))
	require.NoError(t, err)

	rivals := rivalEveryRestart(t, a, "s-2")
	_, err = a.Admit(ctx(t), supersedeRequest("s-2", `1`))
	require.ErrorIs(t, err, jetstream.ErrUnavailable)
	require.Equal(t, maxSupersedeRounds/2, *rivals, "a round to cancel, a round to lose the restart")

	run, _, err := a.runs.Get(ctx(t), "s-2")
	require.NoError(t, err)
	require.Equal(t, state.StatusRunning, run.Status)
	require.Equal(t, *rivals, run.Generation, "one generation per rival")
	require.JSONEq(t, fmt.Sprint(1000+*rivals), string(run.Input))
}

// supersedeRequest is a start of runID with input under Supersede.
func supersedeRequest(runID, input string) Request {
	return Request{RunID: runID, Workflow: "w", Input: json.RawMessage(input), Policy: jetflowtype.ConflictPolicy{WhileRunning: jetflowtype.Supersede}}
}

// rivalEveryRestart makes a rival start of runID (inputs 1001, 1002...)
// supersede just before every restart another start of a's makes, which so
// loses it; it returns the rivals' count.
func rivalEveryRestart(t *testing.T, a *Admitter, runID string) *int {
	rivals, inRival := 0, false
	a.SetHooks(Hooks{AfterRestartPublished: func(string, int) {
		if inRival {
			return
		}
		inRival = true
		defer func() { inRival = false }()
		rivals++
		res, err := a.Admit(ctx(t), supersedeRequest(runID, fmt.Sprint(1000+rivals)))
		require.NoError(t, err)
		require.Equal(t, Superseded, res.Outcome)
	}})
	return &rivals
}

// A start that begins on a generation a superseding start cancelled and
// died before restarting, and that then loses every round: the bound never
// stops it between its own cancel and the restart that follows, so it never
// leaves the run ID with no running generation. (Found by review: starting
// on a cancelled record shifts the rounds by one, and the start gave up
// right after cancelling rival 32's generation.)
func TestSupersedingStartNeverGivesUpAfterItsOwnCancel(t *testing.T) {
	t.Parallel()
	a := setup(t)
	res, err := a.Admit(ctx(t), supersedeRequest("s-9", `0`))
	require.NoError(t, err)
	_, written, err := a.runs.Supersede(ctx(t), res.Run, res.Revision, &state.ErrorInfo{Kind: "cancelled", Code: jetflowtype.CodeSuperseded, Fatal: true, Message: "by a start that died"})
	require.NoError(t, err)
	require.True(t, written)

	rivals := rivalEveryRestart(t, a, "s-9")
	_, err = a.Admit(ctx(t), supersedeRequest("s-9", `1`))
	require.ErrorIs(t, err, jetstream.ErrUnavailable)
	run, _, err := a.runs.Get(ctx(t), "s-9")
	require.NoError(t, err)
	require.Equal(t, state.StatusRunning, run.Status, "the run ID has a running generation")
	require.JSONEq(t, fmt.Sprint(1000+*rivals), string(run.Input), "the last rival's")
}

// A run whose creator wrote its record and then could not publish its
// start task (NATS restarting, the creator dying): the retry of the start,
// a duplicate, finds the run never held (no lease) and publishes its start
// task from the record, with the record's token; a duplicate of a run
// that was held publishes nothing.
func TestDuplicateStartsARunWhoseStartTaskWasLost(t *testing.T) {
	t.Parallel()
	a := setup(t)
	rec, err := a.newRecord(Request{RunID: "lost-1", Workflow: "w", Input: json.RawMessage(`{"n":1}`), Retention: time.Hour}, "creator")
	require.NoError(t, err)
	st, err := a.createOrRead(ctx(t), rec, starter{began: time.Now()})
	require.NoError(t, err)
	require.True(t, st.created)
	subject := jetstream.RunSubject("w", "lost-1")
	_, err = a.assets.Tasks.GetLastMsgForSubject(ctx(t), subject)
	require.Error(t, err, "no start task yet")

	res, err := a.Admit(ctx(t), Request{RunID: "lost-1", Workflow: "w", Input: json.RawMessage(`{"n":1}`), Source: "retry"})
	require.NoError(t, err)
	require.Equal(t, Existing, res.Outcome)
	m, err := a.assets.Tasks.GetLastMsgForSubject(ctx(t), subject)
	require.NoError(t, err, "the duplicate published the run's start task")
	task, err := state.DecodeTask(m.Data)
	require.NoError(t, err)
	require.Equal(t, "creator", task.Token)
	require.Equal(t, time.Hour, task.Retention)

	// Once a delivery has held the run (its lease written), a duplicate
	// publishes nothing: consume the task, write the lease parked.
	require.NoError(t, a.assets.Tasks.DeleteMsg(ctx(t), m.Sequence))
	b, err := state.Encode(state.Lease{V: state.Version, State: state.LeaseParked, Seq: m.Sequence, Delivered: 1, At: time.Now().UTC()})
	require.NoError(t, err)
	_, err = a.assets.Steps.Put(ctx(t), state.LeaseKey("lost-1"), b)
	require.NoError(t, err)
	_, err = a.Admit(ctx(t), Request{RunID: "lost-1", Workflow: "w", Input: json.RawMessage(`{"n":1}`), Source: "retry"})
	require.NoError(t, err)
	_, err = a.assets.Tasks.GetLastMsgForSubject(ctx(t), subject)
	require.Error(t, err, "a duplicate of a held run published a task")
}

// A record the bucket still holds past its retention, as one whose expiry
// an unclean stop of the server undid (it comes back with no TTL), is an
// expired run: a start of its run ID creates a new run over it, and says
// so, as over an expiry marker; a start task of the old run creates
// nothing.
func TestRecordPresentPastItsRetentionIsExpired(t *testing.T) {
	t.Parallel()
	nc := testenv.Conn(t, testenv.Server(t))
	const retention = time.Hour
	assets, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{Retention: retention}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	a := New(assets, Config{})
	old, err := a.newRecord(Request{RunID: "rv-1", Workflow: "w", Input: json.RawMessage(`1`)}, "old")
	require.NoError(t, err)
	old.Status = state.StatusCompleted
	old.UpdatedAt = time.Now().Add(-2 * retention).UTC()
	b, err := state.Encode(old)
	require.NoError(t, err)
	rev, err := assets.Runs.Create(ctx(t), "rv-1", b) // no TTL: as revived
	require.NoError(t, err)

	_, _, err = a.Materialize(ctx(t), state.Task{V: state.Version, RunID: "rv-1", Workflow: "w", Input: json.RawMessage(`1`), Token: "old"})
	require.ErrorIs(t, err, ErrStaleStart, "the expired run's start task")
	res, err := a.Admit(ctx(t), Request{RunID: "rv-1", Workflow: "w", Input: json.RawMessage(`2`)})
	require.NoError(t, err)
	require.Equal(t, Created, res.Outcome)
	require.True(t, res.AfterExpiry)
	require.Equal(t, int(rev), res.Run.Generation, "a new identity")
	require.Equal(t, state.StatusRunning, res.Run.Status)

	// The same record within its retention is the run.
	old.RunID, old.UpdatedAt = "rv-2", time.Now().UTC()
	b, err = state.Encode(old)
	require.NoError(t, err)
	_, err = assets.Runs.Create(ctx(t), "rv-2", b)
	require.NoError(t, err)
	res, err = a.Admit(ctx(t), Request{RunID: "rv-2", Workflow: "w", Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.Equal(t, Existing, res.Outcome)
	require.Equal(t, state.StatusCompleted, res.Run.Status)
}
