package opcluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// The earlier engines an upgrade starts from, as commits of this
// repository: the executor before the lease (protocol 1), and the lease
// executor before engine protocols were recorded (protocol 2).
const (
	executorBeforeLease = "da13377"
	leaseBeforeProtocol = "1719aa8"
)

// buildPrevious builds the worker and producer of commit rev of the
// repository at root into dir. It skips the test when the clone does not
// hold rev (a shallow clone).
func buildPrevious(t *testing.T, ctx context.Context, root, rev, dir string) Binaries {
	t.Helper()
	if err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		t.Skipf("the clone does not hold commit %s (a shallow clone?): %v", rev, err)
	}
	src := filepath.Join(dir, "src-"+rev)
	require.NoError(t, os.MkdirAll(src, 0o755))
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", rev)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	untar.Stdin = pipe
	require.NoError(t, untar.Start())
	require.NoError(t, archive.Run())
	require.NoError(t, untar.Wait())
	b := Binaries{Worker: filepath.Join(dir, "worker-"+rev), Producer: filepath.Join(dir, "producer-"+rev)}
	for bin, pkg := range map[string]string{b.Worker: "./cmd/worker", b.Producer: "./cmd/producer"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
		cmd.Dir = src
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build %s at %s: %s", pkg, rev, out)
	}
	return b
}

// An upgrade from each earlier engine, as docs/operations.md ("Upgrading the engine")
// tells it, under a steady load of order starts through the HTTP API of
// both versions' producers, with duplicate starts of one order sent to both
// versions at once and the carrier's events sent during the overlap:
//
//  1. two workers and a producer of the previous engine serve;
//  2. this version's producer starts, and two workers of this version,
//     which refuse to take work (readyz 503, an error line naming the
//     earlier workers) while the earlier ones are live;
//  3. the earlier workers drain (SIGTERM); this version's become ready and
//     take the runs under way, parked ones included (those of the
//     executor before the lease are taken over);
//  4. `EngineStatus` says the earlier version's work is done.
//
// Every order has exactly one run, completed with all its steps, and
// exactly one charge, the one its charge step committed, and no charge
// request was sent twice: nothing was lost or doubled.
func TestUpgradeFromThePreviousEngine(t *testing.T) {
	t.Parallel()
	for _, rev := range []string{executorBeforeLease, leaseBeforeProtocol} {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			upgradeFrom(t, rev)
		})
	}
}

func upgradeFrom(t *testing.T, rev string) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	buildCtx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prev := buildPrevious(t, buildCtx, root, rev, t.TempDir())
	s := newScenario(t, &prev)

	ledger := faultcheck.NewLedger()
	newProd := make(chan Producer, 1)
	var events eventTally
	n := scale(60, 600)
	every := time.Duration(scale(40, 10)) * time.Millisecond
	loadCtx := s.ctx(120*ackWait + time.Duration(4*n)*every)

	// The load: starts through whichever producers serve, a quarter of
	// them duplicates, and the carrier's event for every other order.
	loaded := make(chan error, 1)
	go func() {
		producers := []Producer{s.prod}
		ids := Plan("up", n)
		for i, id := range ids {
			select {
			case p := <-newProd:
				producers = append(producers, p)
			case <-loadCtx.Done():
				loaded <- loadCtx.Err()
				return
			case <-time.After(every):
			}
			p := producers[i%len(producers)]
			if err := p.StartUntilAccepted(loadCtx, ledger, id); err != nil {
				loaded <- err
				return
			}
			if i%2 == 0 {
				events.goSend(loadCtx, producers[(i+1)%len(producers)], id)
			}
		}
		loaded <- nil
	}()
	require.Eventually(t, func() bool { return ledger.Len() >= n/4 }, 30*ackWait, 10*time.Millisecond, "load before the upgrade")

	// This version's producer and workers join.
	_, next := s.startProducer(s.bins.Producer, "producer-next")
	newProd <- next
	var nextWorkers []*Proc
	var ready []string
	for range 2 {
		w, r := s.spawnWorker(s.bins.Worker, ackWait, false)
		nextWorkers, ready = append(nextWorkers, w), append(ready, r)
	}
	for i, w := range nextWorkers {
		require.Eventually(t, func() bool { return logHas(w.Log, "another engine protocol") }, 30*ackWait, 20*time.Millisecond,
			"%s says why it does not join", w.Name)
		require.Equal(t, http.StatusServiceUnavailable, status(ready[i]), "%s is not ready beside the earlier workers", w.Name)
	}

	// Duplicate starts of one order sent to both versions at once.
	dups := scale(20, 200)
	var wg sync.WaitGroup
	for i := range dups {
		id := fmt.Sprintf("both-%d", i)
		for _, p := range []Producer{s.prod, next} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.StartUntilAccepted(loadCtx, ledger, id); err != nil {
					t.Errorf("start %s at %s: %v", id, p.BaseURL, err)
				}
			}()
		}
		events.goSend(loadCtx, next, id)
	}
	wg.Wait()

	// The earlier workers drain; this version's take over.
	for _, old := range s.workers {
		require.NoError(t, old.Term(10*ackWait), "an earlier worker drains and exits 0")
	}
	s.workers = nextWorkers
	for i, w := range nextWorkers {
		require.NoError(t, w.WaitHTTP(s.ctx(30*ackWait), ready[i]), "%s is ready once the earlier workers are gone", w.Name)
	}
	require.NoError(t, <-loaded, "load")
	events.wait()

	if left := s.unended(s.ctx(60*ackWait), ledger.Tally().RunIDs); len(left) > 0 {
		t.Fatalf("%d runs did not end; the first ones:\n%s", len(left), strings.Join(left[:min(len(left), 5)], "\n"))
	}
	v := Check(s.ctx(60*ackWait), s.client, s.pay, ledger)
	t.Logf("upgrade from %s: %s; events sent %d (answered 2xx %d, 409 %d)", rev, v, events.sent.Load(), events.ok.Load(), events.conflict.Load())
	require.True(t, v.OK(), "%s", v)
	require.Equal(t, v.Runs, v.Completed)
	require.Equal(t, v.Runs, v.Charges, "one charge per order")
	require.Equal(t, v.Charges, v.ChargeRequests, "no charge request was sent twice")
	require.Positive(t, v.Duplicates)
	require.Zero(t, events.failed.Load(), "every event was answered 2xx, or 409 for a run that ended; first failure: %s", events.firstFailure)
	require.Positive(t, events.ok.Load())

	adopted := 0
	for _, w := range nextWorkers {
		adopted += logCount(w.Log, `"outcome":"adopted"`)
	}
	t.Logf("runs of the executor before the lease taken over by this version's workers: %d", adopted)
	if rev != executorBeforeLease {
		require.Zero(t, adopted, "runs of the lease executor run as they are")
	} else {
		require.Positive(t, adopted, "runs under way at the upgrade were taken over")
	}
	for _, name := range jetstream.LegacyConsumerNames(orders.WorkflowName) {
		c, err := s.js.Consumer(s.ctx(10*ackWait), jetstream.TasksStream, name)
		if rev != executorBeforeLease {
			require.ErrorIs(t, err, natsjs.ErrConsumerNotFound)
			continue
		}
		require.NoError(t, err)
		info, err := c.Info(s.ctx(10 * ackWait))
		require.NoError(t, err)
		require.Zero(t, info.NumPending+uint64(info.NumAckPending), "%s: nothing of the previous engine is left", name)
	}

	st, err := s.client.EngineStatus(s.ctx(10 * ackWait))
	require.NoError(t, err)
	require.True(t, st.Ready(), "no earlier worker is live: %+v", st)
	require.True(t, st.OldWorkDone(), "%+v", st)
	require.Equal(t, 2, st.Workers[fmt.Sprint(jetflow.EngineProtocol)], "%+v", st)
}

// eventTally counts the carrier events the load sent and their answers.
type eventTally struct {
	wg                         sync.WaitGroup
	sent, ok, conflict, failed atomic.Int64
	mu                         sync.Mutex
	firstFailure               string
}

// goSend posts the carrier's delivered event to run id through p, in a
// goroutine of its own (wait waits for them), retrying 503 and connection
// errors until answered or ctx ends. A 404 (the start not stored yet) is
// retried too.
func (e *eventTally) goSend(ctx context.Context, p Producer, id string) {
	e.wg.Add(1)
	e.sent.Add(1)
	go func() {
		defer e.wg.Done()
		e.send(ctx, p, id)
	}()
}

func (e *eventTally) send(ctx context.Context, p Producer, id string) {
	body := []byte(`{"carrier":"upgrade"}`)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.BaseURL+"/v1/runs/"+id+"/events/"+orders.EventDelivered, bytes.NewReader(body))
		if err != nil {
			e.fail(err.Error())
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "evt-"+id)
		resp, err := p.HTTP.Do(req)
		code := 0
		var text []byte
		if err == nil {
			code = resp.StatusCode
			text, _ = io.ReadAll(io.LimitReader(resp.Body, 2<<10))
			_ = resp.Body.Close()
		}
		switch {
		case code >= 200 && code < 300:
			e.ok.Add(1)
			return
		case code == http.StatusConflict:
			e.conflict.Add(1)
			return
		case err == nil && code != http.StatusServiceUnavailable && code != http.StatusNotFound:
			e.fail(fmt.Sprintf("event to %s: HTTP %d: %s", id, code, bytes.TrimSpace(text)))
			return
		}
		select {
		case <-ctx.Done():
			e.fail(fmt.Sprintf("event to %s: %v", id, ctx.Err()))
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e *eventTally) fail(why string) {
	e.failed.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.firstFailure == "" {
		e.firstFailure = why
	}
}

func (e *eventTally) wait() { e.wg.Wait() }

// logHas reports whether the log file at path contains s.
func logHas(path, s string) bool { return logCount(path, s) > 0 }

// logCount counts the occurrences of s in the log file at path.
func logCount(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// status is the HTTP status url answers with (0: no answer).
func status(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// unended waits until every run of ids has ended, or ctx ends, and
// describes those that have not: status, block, committed steps, lease
// and pending tasks.
func (s *scenario) unended(ctx context.Context, ids map[string]bool) []string {
	left := maps.Clone(ids)
	for {
		for id := range left {
			rctx, cancel := context.WithTimeout(ctx, ackWait)
			run, err := s.client.GetRun(rctx, id)
			cancel()
			if err == nil && run.Status.Terminal() {
				delete(left, id)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	var out []string
	dctx, cancel := context.WithTimeout(context.Background(), 10*ackWait)
	defer cancel()
	for _, id := range slices.Sorted(maps.Keys(left)) {
		run, err := s.client.GetRun(dctx, id)
		d := fmt.Sprintf("%s: %s %v block=%+v", id, run.Status, err, run.Block)
		steps, err := s.client.Steps(dctx, id)
		for _, st := range steps {
			d += fmt.Sprintf("\n    step %s kind=%s seq=%d worker=%s", st.StepID, st.Kind, st.Seq, st.Worker)
		}
		if err != nil {
			d += fmt.Sprintf("\n    steps: %v", err)
		}
		if kv, err := s.js.KeyValue(dctx, "jetflow_steps"); err == nil {
			if e, err := kv.Get(dctx, id+".lease"); err == nil {
				d += "\n    lease " + string(e.Value())
			} else {
				d += fmt.Sprintf("\n    lease: %v", err)
			}
		}
		for _, subj := range []string{"jetflow.run.order." + id, "jetflow.branch.order." + id + ".>", "jetflow.task.order." + id + ".>"} {
			if st, err := s.js.Stream(dctx, jetstream.TasksStream); err == nil {
				if info, err := st.Info(dctx, natsjs.WithSubjectFilter(subj)); err == nil {
					d += fmt.Sprintf("\n    %s: %d messages", subj, len(info.State.Subjects))
				}
			}
		}
		out = append(out, d)
	}
	return out
}
