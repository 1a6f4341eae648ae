package jetflow

import (
	"sync"
	"testing"
	"time"

	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// A producer whose NATS user may not write the runs bucket nor publish
// tasks (jetflow_producer of deploy/nats/accounts.conf) starts typed runs
// with ClientConfig.StartByRequest: a worker admits them. Start and
// Handle.Result work with no denied operation, repeated and concurrent
// starts of a run ID land on one run that runs its steps once, and a
// workflow no worker serves is ErrUnknownWorkflow at once, not a hang.
func TestStartByRequestAsLeastPrivilegeProducer(t *testing.T) {
	url := securedServer(t)
	ctx := ctxT(t, 60*time.Second)

	wnc, workerPerms := securedConn(t, url, workerUser)
	effects := newCounter()
	wf := threeSteps("by-request", effects)
	w := startWorker(t, wnc, WorkerConfig{}, wf)
	stopAtEnd(t, w, 10*time.Second)
	// Another connection's request must find the start service.
	require.NoError(t, wnc.Flush())

	pnc, producerPerms := securedConn(t, url, producerUser)
	pc, err := NewClient(ctxT(t, 10*time.Second), pnc, ClientConfig{Name: "by-request", StartByRequest: true})
	require.NoError(t, err)

	t.Run("typed start and result", func(t *testing.T) {
		h, err := Start(ctx, pc, wf, 1, WithRunID("req-1"))
		require.NoError(t, err)
		require.Equal(t, "req-1", h.RunID)
		require.Equal(t, OutcomeCreated, h.Outcome)
		// The run's start task is stored before its record: a worker may
		// take it, write the record and run the three steps before the
		// admitting worker reads the record back for the reply.
		require.Contains(t, []RunStatus{StatusRunning, StatusCompleted}, h.Status)
		out, err := h.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, 4, out)

		dup, err := Start(ctx, pc, wf, 1, WithRunID("req-1"))
		require.NoError(t, err)
		require.Equal(t, "req-1", dup.RunID)
		require.Equal(t, OutcomeExisting, dup.Outcome)
		require.Equal(t, StatusCompleted, dup.Status)
		require.Equal(t, int64(1), dup.Duplicates)
		again, err := dup.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, 4, again)

		run, err := pc.GetRun(ctx, "req-1")
		require.NoError(t, err)
		require.Equal(t, int64(1), run.Duplicates)
		require.Equal(t, "by-request", run.FirstDuplicate.Source)

		_, err = Start(ctx, pc, wf, 2, WithRunID("req-1"))
		require.ErrorIs(t, err, ErrIdempotencyConflict, "another input under the run ID")
	})

	t.Run("concurrent duplicates land on one run", func(t *testing.T) {
		const n = 8
		handles := make([]*Handle[int], n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				handles[i], errs[i] = Start(ctx, pc, wf, 10, WithRunID("req-many"))
			}()
		}
		wg.Wait()
		created := 0
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, "req-many", handles[i].RunID)
			if handles[i].Outcome == OutcomeCreated {
				created++
			}
		}
		require.Equal(t, 1, created, "exactly one start created the run")
		for _, h := range handles {
			out, err := h.Result(ctx)
			require.NoError(t, err)
			require.Equal(t, 13, out)
		}
		for _, step := range []string{"a", "b", "c"} {
			require.Equal(t, 1, effects.get("req-many."+step+".0"), "step %s ran once", step)
		}
	})

	t.Run("generated run ID", func(t *testing.T) {
		h, err := Start(ctx, pc, wf, 0, WithGeneratedRunID())
		require.NoError(t, err)
		require.NotEmpty(t, h.RunID)
		require.Equal(t, OutcomeCreated, h.Outcome)
		out, err := h.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, out)
	})

	t.Run("no worker serves the workflow", func(t *testing.T) {
		unserved := threeSteps("by-request-unserved", newCounter())
		began := time.Now()
		_, err := Start(ctxT(t, 30*time.Second), pc, unserved, 1, WithRunID("req-nobody"))
		require.ErrorIs(t, err, ErrUnknownWorkflow)
		require.Contains(t, err.Error(), "no worker serves")
		require.Less(t, time.Since(began), 10*time.Second, "an answer, not a timeout")
		_, err = pc.GetRun(ctx, "req-nobody")
		require.ErrorIs(t, err, ErrRunNotFound, "nothing stored")
	})

	producerPerms.requireNone(t)
	require.NoError(t, w.Stop(ctxT(t, 10*time.Second)))
	workerPerms.requireNone(t)
}

// A start answered by a worker of a version before generations (its reply
// has no "generation", as during a rolling deploy) gives a handle that
// waits for whichever generation runs the run ID, as WaitRun does: it is
// not taken for generation 0, whose handle reports it replaced.
func TestStartAnsweredWithoutGenerationWaitsForAnyGeneration(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := threeSteps("oldreply", newCounter())
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	// Generation 0, cancelled, then generation 1 (no worker runs them yet).
	h0, err := Start(ctx, c, wf, 1, WithRunID("old-1"))
	require.NoError(t, err)
	_, err = c.CancelRun(ctx, "old-1")
	require.NoError(t, err)
	h1, err := Start(ctx, c, wf, 10, WithRunID("old-1"), WithConflictPolicy(ConflictPolicy{AfterFailed: StartNew}))
	require.NoError(t, err)
	require.Equal(t, OutcomeRestarted, h1.Outcome)
	require.Equal(t, 1, h1.Generation)

	// The old worker's answer to a start of old-1.
	nc := env.conn()
	sub, err := nc.Subscribe(startproto.AdmitSubjectPrefix+wf.Name(), func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"outcome":"existing","run_id":"old-1","workflow":"oldreply","status":"running","duplicates":1}`))
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	pc, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)
	h, err := Start(ctx, pc, wf, 10, WithRunID("old-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, h.Outcome)
	require.NoError(t, sub.Unsubscribe())

	env.worker(WorkerConfig{}, wf)
	out, err := h.Result(ctx)
	require.NoError(t, err, "the generation that ran is the handle's answer")
	require.Equal(t, 13, out)
	_, err = h0.Result(ctx)
	require.ErrorIs(t, err, ErrRunReplaced, "a handle that knows its generation 0 is told it was replaced")
}
