package opcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// scale is the reduced load in CI, the full one with JETFLOW_FAULT_FULL=1
// (as the root package's fault tests).
func scale(reduced, full int) int {
	if os.Getenv("JETFLOW_FAULT_FULL") != "" {
		return full
	}
	return reduced
}

// The workers' AckWait before and after the rolling deploy. Every
// allowance of the scenario is a multiple of them.
const (
	ackWait     = 2 * time.Second
	ackWaitNext = 3 * time.Second
)

// scenario is one operated deployment: the processes and what the test
// uses to watch them.
type scenario struct {
	t        *testing.T
	dir      string
	bins     Binaries // this version's
	first    Binaries // the binaries the deployment starts with: bins, or an earlier version's
	extra    []string // flags every worker gets besides the scenario's own
	cluster  *Cluster
	env      []string // the account passwords of the shipped accounts.conf
	pw       map[string]string
	pay      *orders.PaymentService
	prod     Producer
	client   *jetflow.Client // the test's reader, as jetflow_producer
	js       natsjs.JetStream
	workers  []*Proc
	nworkers int // how many worker processes were ever started (their names)
}

// PhaseResult is what one phase cost.
type PhaseResult struct {
	Name     string
	Verdict  Verdict
	Recover  time.Duration // from the fault until a run started after it completed
	Election time.Duration // from the kill until the stream reported a new leader (leader kills only)
	Took     time.Duration // how long the fault itself took (a roll)
}

// The shipped deploy/nats cluster, run as three nats-server processes,
// with two worker processes and a `producer serve` process, under a steady
// load of order starts (a quarter of them duplicates) through the HTTP
// API. One phase after another: SIGKILL of the node leading JETFLOW_TASKS,
// of the node leading the runs bucket, of a follower (each node restarted
// after the phase's recovery), a rolling restart of the three nodes, and a
// rolling deploy of the workers that raises --ack-wait. After each phase
// every order has exactly one run, completed with all its steps, and
// exactly one charge at the payment service, the one its charge step
// committed; the consumer's AckWait is the new one after the deploy.
func TestOperatedClusterNodeLossAndRollingDeploys(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil)
	n := scale(45, 1000)
	every := time.Duration(scale(40, 10)) * time.Millisecond

	var results []PhaseResult
	results = append(results, s.phase("stream leader killed", "sl", n, every, s.killLeaderOf("JETFLOW_TASKS")))
	results = append(results, s.phase("runs-bucket leader killed", "rl", n, every, s.killLeaderOf("KV_jetflow_runs")))
	results = append(results, s.phase("follower killed", "fo", n, every, s.killFollower))
	results = append(results, s.phase("rolling restart of NATS", "rr", n, every, s.rollNATS))
	results = append(results, s.phase("rolling deploy of workers", "wd", n, every, s.rollWorkers))

	for _, cons := range []string{"jetflow_run_", "jetflow_branch_"} {
		info, err := s.js.Consumer(s.ctx(10*time.Second), "JETFLOW_TASKS", cons+orders.WorkflowName)
		require.NoError(t, err)
		require.Equal(t, ackWaitNext, info.CachedInfo().Config.AckWait, "%s: the rolling deploy's --ack-wait --apply-ack-wait", cons)
	}

	var table strings.Builder
	fmt.Fprintf(&table, "| phase | starts | runs | duplicates | retried starts | committed steps | charges | charge requests | lost | doubled | new leader | recovered |\n")
	for _, r := range results {
		v := r.Verdict
		election := "-"
		if r.Election > 0 {
			election = r.Election.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&table, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", r.Name, v.Starts, v.Runs, v.Duplicates,
			v.Retried, v.CommittedSteps, v.Charges, v.ChargeRequests, v.Lost, v.Doubled, election, r.Recover.Round(10*time.Millisecond))
	}
	t.Logf("summary (AckWait %s, then %s):\n%s", ackWait, ackWaitNext, table.String())
}

// newScenario builds the binaries, starts the cluster on the shipped
// configuration, the payment service, two workers and the producer. The
// workers and the producer are first's (nil: this version's); every worker
// gets the flags extra too.
func newScenario(t *testing.T, first *Binaries, extra ...string) *scenario {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	s := &scenario{t: t, dir: t.TempDir(), pw: map[string]string{}, extra: extra}
	t.Cleanup(func() { keepLogs(t, s.dir) })
	s.bins, err = Build(s.ctx(5*time.Minute), root, filepath.Join(s.dir, "bin"))
	require.NoError(t, err)
	s.first = s.bins
	if first != nil {
		s.first = *first
	}

	for _, user := range []string{"WORKER", "OPERATOR", "PRODUCER"} {
		s.pw[user] = "pw-" + strings.ToLower(user) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		s.env = append(s.env, "JETFLOW_"+user+"_PASSWORD="+s.pw[user])
	}
	s.cluster, err = NewCluster(s.bins.NATSServer, filepath.Join(root, "deploy", "nats"), s.dir, s.env)
	require.NoError(t, err)
	t.Cleanup(s.cluster.Close)
	require.NoError(t, s.cluster.WaitAllHealthy(s.ctx(30*ackWait)))

	s.pay, err = orders.StartPaymentService(orders.PaymentOptions{Log: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.pay.Close() })

	// The first worker creates the R3 streams and buckets; the producer
	// and the reader only look them up.
	for range 2 {
		s.workers = append(s.workers, s.startFirstWorker())
	}
	_, s.prod = s.startProducer(s.first.Producer, "producer")

	// The reader reads runs and steps as a producer does; leaders and the
	// consumer's AckWait are asked as a worker (the producer user may not
	// read consumer info).
	s.client, err = jetflow.NewClient(s.ctx(30*ackWait), s.conn("jetflow_producer", "PRODUCER"),
		jetflow.ClientConfig{Name: "opcluster-test", Topology: jetflow.Topology{Replicas: 3}})
	require.NoError(t, err)
	s.js, err = natsjs.New(s.conn("jetflow_worker", "WORKER"))
	require.NoError(t, err)
	return s
}

// conn connects to the cluster as user (a user of the shipped
// accounts.conf, whose password is s.pw[key]), reconnecting for ever.
func (s *scenario) conn(user, key string) *nats.Conn {
	nc, err := jetflow.Connect(s.cluster.URLs(), nats.UserInfo(user, s.pw[key]), nats.MaxReconnects(-1))
	require.NoError(s.t, err)
	s.t.Cleanup(nc.Close)
	return nc
}

// ctx is a context that ends after d or with the test.
func (s *scenario) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	s.t.Cleanup(cancel)
	return ctx
}

// startProducer starts bin's `producer serve` on the cluster as name and
// waits until its /readyz answers 200.
func (s *scenario) startProducer(bin, name string) (*Proc, Producer) {
	t := s.t
	port, err := FreePorts(1)
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port[0])
	prod, err := StartProc(s.dir, name, append(s.env, "JETFLOW_NATS_PASSWORD="+s.pw["PRODUCER"]), bin, "serve",
		"--http-addr", addr, "--nats-url", s.cluster.URLs(), "--nats-user", "jetflow_producer", "--replicas", "3")
	require.NoError(t, err)
	t.Cleanup(prod.Kill)
	require.NoError(t, prod.WaitHTTP(s.ctx(30*ackWait), "http://"+addr+"/readyz"))
	return prod, Producer{BaseURL: "http://" + addr, HTTP: &http.Client{}}
}

// startFirstWorker starts one of the deployment's first workers (first's)
// and waits until it is ready. One that exits first is started again, up
// to three times: an earlier version's worker gives up when provisioning
// the new cluster's streams outlasts its own deadline (30 s) on a loaded
// machine, where this version's retries.
func (s *scenario) startFirstWorker() *Proc {
	var err error
	for range 3 {
		w, ready := s.spawnWorker(s.first.Worker, ackWait, false)
		if err = w.WaitHTTP(s.ctx(30*ackWait), ready); err == nil {
			return w
		}
		if w.Running() {
			break
		}
		s.t.Logf("started again: %v", err)
	}
	require.NoError(s.t, err)
	return nil
}

// startWorker starts a worker process of this version on the cluster and
// waits until its /readyz answers 200. apply makes its --ack-wait the
// deployment's.
func (s *scenario) startWorker(ack time.Duration, apply bool) *Proc {
	w, ready := s.spawnWorker(s.bins.Worker, ack, apply)
	require.NoError(s.t, w.WaitHTTP(s.ctx(30*ack), ready))
	return w
}

// spawnWorker starts bin's worker on the cluster and returns it with the
// URL of its /readyz.
func (s *scenario) spawnWorker(bin string, ack time.Duration, apply bool) (*Proc, string) {
	t := s.t
	port, err := FreePorts(1)
	require.NoError(t, err)
	s.nworkers++
	args := []string{"--nats-url", s.cluster.URLs(), "--nats-user", "jetflow_worker", "--replicas", "3",
		"--ack-wait", ack.String(), "--drain-timeout", (5 * ack).String(), "--concurrency", "16",
		"--ops-addr", "127.0.0.1:" + strconv.Itoa(port[0]), "--payments-url", s.pay.URL(), "--log-format", "json"}
	if apply {
		args = append(args, "--apply-ack-wait")
	}
	args = append(args, s.extra...)
	w, err := StartProc(s.dir, "worker-"+strconv.Itoa(s.nworkers), append(s.env, "JETFLOW_NATS_PASSWORD="+s.pw["WORKER"]), bin, args...)
	require.NoError(t, err)
	t.Cleanup(w.Kill)
	return w, "http://127.0.0.1:" + strconv.Itoa(port[0]) + "/readyz"
}

// fault disrupts the deployment. It calls hit at the moment of the
// disruption (a kill, the first stop of a roll), and returns a function
// that restores the deployment once the phase has recovered (nil when the
// fault restores it itself), and how long the stream took to report a new
// leader (0 when not a leader kill).
type fault func(hit func()) (restore func(), election time.Duration)

// phase runs one fault under load and reads everything back.
func (s *scenario) phase(name, prefix string, n int, every time.Duration, f fault) PhaseResult {
	t := s.t
	ledger := faultcheck.NewLedger()
	ids := Plan(prefix, n)
	loadCtx := s.ctx(60*ackWait + time.Duration(len(ids))*every)
	loaded := make(chan error, 1)
	go func() { loaded <- s.prod.Load(loadCtx, ledger, ids, every) }()
	require.Eventually(t, func() bool { return ledger.Len() >= len(ids)/3 }, 30*ackWait, 10*time.Millisecond, "%s: load", name)

	res := PhaseResult{Name: name}
	recovered := make(chan time.Duration, 1)
	var hitAt time.Time
	begin := time.Now()
	restore, election := f(func() {
		hitAt = time.Now()
		go func() { recovered <- s.probe(loadCtx, prefix+"-probe", hitAt) }()
	})
	res.Took, res.Election = time.Since(begin), election
	res.Recover = <-recovered
	require.Positive(t, res.Recover, "%s: a run started after the fault never completed", name)
	if restore != nil {
		restore()
	}
	require.NoError(t, <-loaded, "%s: load", name)

	res.Verdict = Check(s.ctx(30*ackWait), s.client, s.pay, ledger)
	t.Logf("%s: %s; new leader after %s, a new run completed %s after the fault; the fault took %s",
		name, res.Verdict, res.Election.Round(time.Millisecond), res.Recover.Round(time.Millisecond), res.Took.Round(time.Millisecond))
	require.True(t, res.Verdict.OK(), "%s: %s", name, res.Verdict)
	require.Equal(t, res.Verdict.Runs, res.Verdict.Completed, name)
	require.Equal(t, res.Verdict.Runs, res.Verdict.Charges, "%s: one charge per order", name)
	require.Positive(t, res.Verdict.Duplicates, name)
	return res
}

// probe starts run id (retrying while the deployment is unavailable),
// reads it until it is completed, and returns the time from since; 0 if
// it did not complete before ctx ended. It reads (GetRun) rather than
// watches, so that what it measures is the engine's recovery, not a
// watch's.
func (s *scenario) probe(ctx context.Context, id string, since time.Time) time.Duration {
	if err := s.prod.StartUntilAccepted(ctx, faultcheck.NewLedger(), id); err != nil {
		s.t.Errorf("probe %s: %v", id, err)
		return 0
	}
	var last string
	for {
		rctx, cancel := context.WithTimeout(ctx, ackWait)
		run, err := s.client.GetRun(rctx, id)
		cancel()
		if err == nil && run.Status == jetflow.StatusCompleted {
			return time.Since(since)
		}
		last = fmt.Sprintf("%s %v", run.Status, err)
		select {
		case <-ctx.Done():
			s.t.Errorf("probe %s not completed: last read %s", id, last)
			return 0
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// killLeaderOf SIGKILLs the node leading stream and measures how long the
// stream takes to report another leader; the node is restarted by the
// returned restore, which waits until every node is healthy.
func (s *scenario) killLeaderOf(stream string) fault {
	return func(hit func()) (func(), time.Duration) {
		i, err := s.cluster.Leader(s.ctx(30*ackWait), s.js, stream, -1)
		require.NoError(s.t, err)
		s.t.Logf("%s is led by %s: SIGKILL", stream, NodeName(i))
		s.cluster.Kill(i)
		killed := time.Now()
		hit()
		next, err := s.cluster.Leader(s.ctx(30*ackWait), s.js, stream, i)
		require.NoError(s.t, err)
		election := time.Since(killed)
		s.t.Logf("%s is led by %s after %s", stream, NodeName(next), election.Round(time.Millisecond))
		return s.restartNode(i), election
	}
}

// killFollower SIGKILLs a node that leads neither the task stream nor the
// runs bucket (with three nodes and two leaders there is one), preferring
// one that also leads none of the workflow's task consumers: those have
// leaders of their own, and a consumer leader's loss is an election too.
// It logs what the victim led.
func (s *scenario) killFollower(hit func()) (func(), time.Duration) {
	ctx := s.ctx(30 * ackWait)
	leads := map[int][]string{}
	for _, stream := range []string{"JETFLOW_TASKS", "KV_jetflow_runs"} {
		i, err := s.cluster.Leader(ctx, s.js, stream, -1)
		require.NoError(s.t, err)
		leads[i] = append(leads[i], stream)
	}
	victim := -1
	for i := range Size {
		if len(leads[i]) == 0 {
			victim = i
		}
	}
	require.GreaterOrEqual(s.t, victim, 0, "every node leads a stream")
	for _, cons := range []string{"jetflow_run_", "jetflow_branch_"} {
		i, err := s.cluster.ConsumerLeader(ctx, s.js, "JETFLOW_TASKS", cons+orders.WorkflowName)
		require.NoError(s.t, err)
		leads[i] = append(leads[i], cons+orders.WorkflowName)
	}
	for i := range Size {
		if len(leads[i]) == 0 {
			victim = i
		}
	}
	s.t.Logf("%s leads %v (neither the task stream nor the runs bucket): SIGKILL", NodeName(victim), leads[victim])
	s.cluster.Kill(victim)
	hit()
	return s.restartNode(victim), 0
}

// restartNode returns a function that starts node i again and waits until
// every node reports healthy (its streams caught up).
func (s *scenario) restartNode(i int) func() {
	return func() {
		require.NoError(s.t, s.cluster.Start(i))
		require.NoError(s.t, s.cluster.WaitAllHealthy(s.ctx(30*ackWait)))
	}
}

// rollNATS restarts the nodes one at a time, as an upgrade would: stop,
// start, wait until every node is healthy, next. The full run stops each
// node in lame duck mode, as docs/operations.md ("Upgrading") says to (40 s
// a node with the shipped settings); the reduced one with SIGTERM, a
// graceful stop that hands leaderships over at once.
func (s *scenario) rollNATS(hit func()) (func(), time.Duration) {
	for i := range Size {
		if os.Getenv("JETFLOW_FAULT_FULL") != "" {
			require.NoError(s.t, s.cluster.StopLameDuck(i, 15*ackWait))
		} else {
			require.NoError(s.t, s.cluster.Stop(i, 15*ackWait))
		}
		if i == 0 {
			hit()
		}
		s.restartNode(i)()
	}
	return nil, 0
}

// rollWorkers replaces each worker by one with --ack-wait ackWaitNext and
// --apply-ack-wait, new first, then the old one drains (SIGTERM, exit 0).
func (s *scenario) rollWorkers(hit func()) (func(), time.Duration) {
	for i, old := range s.workers {
		s.workers[i] = s.startWorker(ackWaitNext, true)
		require.NoError(s.t, old.Term(10*ackWait), "a drained worker exits 0")
		if i == 0 {
			hit()
		}
	}
	return nil, 0
}

// keepLogs copies the processes' logs out of dir, which the test removes,
// when the test failed, and says where.
func keepLogs(t *testing.T, dir string) {
	if !t.Failed() {
		return
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		return
	}
	keep, err := os.MkdirTemp("", "jetflow-"+strings.ReplaceAll(t.Name(), "/", "_")+"-logs-")
	if err != nil {
		t.Logf("keep the logs: %v", err)
		return
	}
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(keep, filepath.Base(l)), b, 0o600)
		}
	}
	t.Logf("the processes' logs are kept in %s", keep)
}
