package testenv

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// ClusterSize is the number of nodes NewCluster starts.
const ClusterSize = 3

// clusterWait bounds every wait on the cluster (readiness, leaders, a
// restarted node catching up). Elections on a healthy local cluster take
// well under a second; the bound is for a loaded CI machine.
const clusterWait = 30 * time.Second

// Cluster is a three-node JetStream cluster running in the test process.
// Nodes are addressed by index (0..2). Each node keeps its store directory
// and its two ports for the whole test, so a stopped node comes back as the
// same peer with its data, and clients reconnect to the same addresses.
// Everything is shut down when the test ends.
type Cluster struct {
	t     testing.TB
	name  string
	mu    sync.Mutex
	nodes [ClusterSize]*clusterNode
}

type clusterNode struct {
	name        string
	storeDir    string
	clientPort  int
	clusterPort int
	srv         *server.Server // nil while stopped
}

// NewCluster starts three nodes routed to each other, waits until JetStream
// has a meta leader and every node is current, and registers the shutdown
// with t.Cleanup.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t, name: "jf-" + strconv.Itoa(rand.IntN(1_000_000))}
	ports := FreePorts(t, 2*ClusterSize)
	dir := t.TempDir()
	for i := range c.nodes {
		c.nodes[i] = &clusterNode{
			name:        fmt.Sprintf("%s-n%d", c.name, i),
			storeDir:    filepath.Join(dir, fmt.Sprintf("n%d", i)),
			clientPort:  ports[2*i],
			clusterPort: ports[2*i+1],
		}
	}
	t.Cleanup(c.shutdown)
	for i := range c.nodes {
		c.startNode(i)
	}
	c.WaitReady()
	return c
}

// routes are the cluster URLs of all nodes; a node ignores the one that
// points at itself.
func (c *Cluster) routes() []*url.URL {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats-route://127.0.0.1:%d", n.clusterPort))
	}
	return server.RoutesFromStr(strings.Join(urls, ","))
}

func (c *Cluster) startNode(i int) {
	c.t.Helper()
	n := c.nodes[i]
	opts := &server.Options{
		ServerName: n.name,
		Host:       "127.0.0.1",
		Port:       n.clientPort,
		JetStream:  true,
		StoreDir:   n.storeDir,
		NoSigs:     true,
		NoLog:      os.Getenv("JETFLOW_TEST_NATS_LOG") == "",
		Cluster: server.ClusterOpts{
			Name: c.name,
			Host: "127.0.0.1",
			Port: n.clusterPort,
		},
		Routes: c.routes(),
	}
	srv, err := server.NewServer(opts)
	require.NoError(c.t, err, "node %s", n.name)
	if !opts.NoLog {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(clusterWait) {
		srv.Shutdown()
		c.t.Fatalf("node %s not ready for connections on ports %d/%d", n.name, n.clientPort, n.clusterPort)
	}
	c.mu.Lock()
	n.srv = srv
	c.mu.Unlock()
}

func (c *Cluster) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.srv != nil {
			n.srv.Shutdown()
			n.srv.WaitForShutdown()
			n.srv = nil
		}
	}
}

// running returns the servers that are up, by index (nil when stopped).
func (c *Cluster) running() [ClusterSize]*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [ClusterSize]*server.Server
	for i, n := range c.nodes {
		out[i] = n.srv
	}
	return out
}

// poll calls cond every 20ms until it returns "" or the deadline passes,
// and then fails the test with the last reason.
func (c *Cluster) poll(what string, cond func() string) {
	c.t.Helper()
	deadline := time.Now().Add(clusterWait)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster %s: %s not reached after %s: %s", c.name, what, clusterWait, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitReady waits until a running node is the JetStream meta leader, the
// leader sees every running node as an online peer, and every running node
// reports healthy (JetStream current, every stream and consumer assigned to
// it caught up). Call it after a Restart before relying on the restarted
// node's replicas.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	c.poll("JetStream ready", func() string {
		nodes := c.running()
		var leader *server.Server
		up := 0
		for _, s := range nodes {
			if s == nil {
				continue
			}
			up++
			if s.JetStreamIsLeader() {
				leader = s
			}
		}
		if leader == nil {
			return "no meta leader"
		}
		if peers := leader.JetStreamClusterPeers(); len(peers) != up {
			return fmt.Sprintf("meta leader %s sees peers %v, %d nodes up", leader.Name(), peers, up)
		}
		for _, s := range nodes {
			if s == nil {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return s.Name() + " not current with the meta leader"
			}
			if h := s.Healthz(nil); h.Status != "ok" {
				return fmt.Sprintf("%s unhealthy: %s", s.Name(), h.Error)
			}
		}
		return ""
	})
}

// URLs is the comma-separated client URL list of all nodes, for a
// connection that fails over between them.
func (c *Cluster) URLs() string {
	urls := make([]string, ClusterSize)
	for i := range c.nodes {
		urls[i] = c.ClientURL(i)
	}
	return strings.Join(urls, ",")
}

// ClientURL is node i's client URL; it does not change across restarts.
func (c *Cluster) ClientURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].clientPort)
}

// Name is node i's server name, as stream info reports leaders.
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// Server is node i's running server, nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server { return c.running()[i] }

// Conn connects to the cluster, closed when the test ends. The connection
// knows every node's URL and reconnects forever, so it fails over when the
// node it is on stops. With prefer >= 0 it tries node prefer first (the
// others follow in order); otherwise the node is picked at random.
func (c *Cluster) Conn(t testing.TB, prefer int) *nats.Conn {
	t.Helper()
	urls := c.URLs()
	var extra []nats.Option
	if prefer >= 0 {
		order := []string{c.ClientURL(prefer)}
		for i := range c.nodes {
			if i != prefer {
				order = append(order, c.ClientURL(i))
			}
		}
		urls = strings.Join(order, ",")
		extra = append(extra, nats.DontRandomize())
	}
	nc, err := jetstream.Connect(urls, t.Name(), extra...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// Stop shuts node i down (as a clean process exit: the leaderships it holds
// are handed over first) and waits until it is gone. Its store directory and
// ports are kept for Restart.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	require.NotNil(c.t, srv, "node %d is not running", i)
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart starts the stopped node i again with the same name, store
// directory and ports, and waits until the cluster is ready with it
// (WaitReady).
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	require.Nil(c.t, c.Server(i), "node %d is running", i)
	c.startNode(i)
	c.WaitReady()
}

// StreamLeader waits until one running node leads the stream (in the global
// account) and returns its index. A KV bucket's stream is KV_<bucket>.
func (c *Cluster) StreamLeader(stream string) int {
	c.t.Helper()
	return c.leaderOf("stream "+stream, func(s *server.Server) bool {
		return s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream)
	})
}

// BucketLeader is StreamLeader of the KV bucket's stream.
func (c *Cluster) BucketLeader(bucket string) int { return c.StreamLeader("KV_" + bucket) }

// ConsumerLeader waits until one running node leads the durable consumer
// of stream and returns its index.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	c.t.Helper()
	return c.leaderOf("consumer "+stream+" > "+consumer, func(s *server.Server) bool {
		return s.JetStreamIsConsumerLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream, consumer)
	})
}

func (c *Cluster) leaderOf(what string, leads func(*server.Server) bool) int {
	c.t.Helper()
	leader := -1
	c.poll("leader of "+what, func() string {
		leader = -1
		for i, s := range c.running() {
			if s != nil && leads(s) {
				if leader >= 0 {
					return "two nodes claim the leadership"
				}
				leader = i
			}
		}
		if leader < 0 {
			return "no leader"
		}
		return ""
	})
	return leader
}

// MoveLeader makes node i the leader of stream by asking the current leader
// to step down in its favour, and waits until it is. Tests use it to put the
// leadership they are about to fault on one node and keep the others away
// from it.
func (c *Cluster) MoveLeader(nc *nats.Conn, stream string, i int) {
	c.t.Helper()
	c.moveLeader(nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, i, func() int { return c.StreamLeader(stream) })
}

// MoveConsumerLeader is MoveLeader for a durable consumer of stream.
func (c *Cluster) MoveConsumerLeader(nc *nats.Conn, stream, consumer string, i int) {
	c.t.Helper()
	c.moveLeader(nc, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer, i,
		func() int { return c.ConsumerLeader(stream, consumer) })
}

func (c *Cluster) moveLeader(nc *nats.Conn, subject string, i int, leader func() int) {
	c.t.Helper()
	req, err := json.Marshal(server.JSApiLeaderStepdownRequest{Placement: &server.Placement{Preferred: c.Name(i)}})
	require.NoError(c.t, err)
	// A stepdown whose new leader is not node i (it was not caught up, so
	// the election passed it over) is asked again only after a pause that
	// grows, so that node i can catch up between elections: asking again
	// at once, on a loaded machine, kept the group electing for 30 s.
	var last time.Time
	pause := 100 * time.Millisecond
	c.poll(fmt.Sprintf("%s to %s", subject, c.Name(i)), func() string {
		if leader() == i {
			return ""
		}
		if time.Since(last) < pause {
			return "waiting before asking again"
		}
		last, pause = time.Now(), min(2*pause, 3*time.Second)
		msg, err := nc.Request(subject, req, 5*time.Second)
		if err != nil {
			return err.Error()
		}
		var resp server.ApiResponse
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return err.Error()
		}
		if resp.Error != nil {
			return resp.Error.Error()
		}
		return "stepped down, waiting for the election"
	})
}

// portsMu guards portsTaken: ports handed out in this process, so that
// parallel tests never get the same one.
var (
	portsMu    sync.Mutex
	portsTaken = map[int]bool{}
)

// FreePorts picks n free TCP ports on 127.0.0.1. They are drawn below the
// kernel's ephemeral range (32768 and up on Linux), where port -1 would land:
// a node's ports must stay free while it is stopped, and a port in the
// ephemeral range can meanwhile become the local port of some outgoing
// connection (a client reconnecting to that very node, for one). Use them
// for a server that must be reachable at a port known before it starts.
// No two calls in one process return the same port.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var out []int
	for tries := 0; len(out) < n; tries++ {
		require.Less(t, tries, 10_000, "no free port found")
		p := 20_000 + rand.IntN(12_000)
		if portsTaken[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		portsTaken[p] = true
		out = append(out, p)
	}
	return out
}
