package opcluster

import (
	"context"
	"errors"
	"fmt"
	"os"

	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Cluster is three nats-server processes on the shipped configuration. A
// node keeps its ports and store directory across restarts, as a machine
// keeps its address and disk.
type Cluster struct {
	bin   string
	dir   string
	env   []string
	ports [Size]Ports
	confs [Size]string
	nodes [Size]*Proc
}

// NewCluster renders the shipped configs under deployNATS (deploy/nats) into
// dir on free ports and starts the three nodes. env carries the account
// passwords the shipped accounts.conf reads (JETFLOW_*_PASSWORD). Call
// WaitHealthy before using it, and Close when done.
func NewCluster(bin, deployNATS, dir string, env []string) (*Cluster, error) {
	c := &Cluster{bin: bin, dir: dir, env: env}
	free, err := FreePorts(3 * Size)
	if err != nil {
		return nil, err
	}
	var stores [Size]string
	for i := range Size {
		c.ports[i] = Ports{Client: free[3*i], Monitor: free[3*i+1], Route: free[3*i+2]}
		stores[i] = filepath.Join(dir, "data", NodeName(i))
	}
	if c.confs, err = RenderConfigs(deployNATS, filepath.Join(dir, "nats"), c.ports, stores); err != nil {
		return nil, err
	}
	for i := range Size {
		if err := c.Start(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Start starts node i (again) on its config.
func (c *Cluster) Start(i int) error {
	if c.nodes[i] != nil && c.nodes[i].Running() {
		return fmt.Errorf("opcluster: %s is already running", NodeName(i))
	}
	p, err := StartProc(c.dir, NodeName(i), c.env, c.bin, "-c", c.confs[i])
	if err != nil {
		return err
	}
	c.nodes[i] = p
	return nil
}

// Kill SIGKILLs node i: no lame duck, no leadership handover, as a crashed
// machine.
func (c *Cluster) Kill(i int) { c.nodes[i].Kill() }

// Stop stops node i with SIGTERM (a graceful shutdown: the server hands
// over its leaderships) and waits for it to exit.
func (c *Cluster) Stop(i int, timeout time.Duration) error { return c.nodes[i].Term(timeout) }

// StopLameDuck puts node i in lame duck mode (SIGUSR2, what `nats-server
// --signal ldm` sends): it stops accepting clients, moves its clients off
// over the config's lame_duck_duration and exits. It waits for the exit
// up to the config's grace period plus duration plus slack.
func (c *Cluster) StopLameDuck(i int, slack time.Duration) error {
	conf, err := os.ReadFile(c.confs[i])
	if err != nil {
		return err
	}
	d, err := LameDuck(string(conf))
	if err != nil {
		return err
	}
	return c.nodes[i].Stop(syscall.SIGUSR2, d+slack)
}

// Close kills every node still running.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		if n != nil {
			n.Kill()
		}
	}
}

// URLs is the client URL list of the three nodes, comma-separated, as
// workers and producers are given it.
func (c *Cluster) URLs() string {
	urls := make([]string, Size)
	for i, p := range c.ports {
		urls[i] = "nats://127.0.0.1:" + strconv.Itoa(p.Client)
	}
	return strings.Join(urls, ",")
}

// WaitHealthy waits until node i's monitoring endpoint /healthz answers
// 200, which nats-server does once it is up and its JetStream assets are
// current with their leaders.
func (c *Cluster) WaitHealthy(ctx context.Context, i int) error {
	return c.nodes[i].WaitHTTP(ctx, "http://127.0.0.1:"+strconv.Itoa(c.ports[i].Monitor)+"/healthz")
}

// WaitAllHealthy is WaitHealthy for every node.
func (c *Cluster) WaitAllHealthy(ctx context.Context) error {
	for i := range Size {
		if err := c.WaitHealthy(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// errNoLeader is what Leader waits through: the stream has no leader
// (an election is under way) or its leader is one the caller excluded.
var errNoLeader = errors.New("no eligible leader")

// Leader asks the cluster ($JS.API.STREAM.INFO, answered by the stream's
// leader) which node leads stream, and returns its index. It waits,
// until ctx ends, while the stream has no leader or its leader is the node
// not (pass -1 to accept any): after a leader is killed, it returns the
// newly elected one.
func (c *Cluster) Leader(ctx context.Context, js natsjs.JetStream, stream string, not int) (int, error) {
	var last error
	for {
		i, err := c.leaderOnce(ctx, js, stream)
		if err == nil && i != not {
			return i, nil
		}
		if err == nil {
			err = fmt.Errorf("%w: %s still reports %s", errNoLeader, stream, NodeName(i))
		}
		last = err
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("opcluster: leader of %s: %w (last: %v)", stream, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) leaderOnce(ctx context.Context, js natsjs.JetStream, stream string) (int, error) {
	return leaderOf(ctx, stream, func(ctx context.Context) (*natsjs.ClusterInfo, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo().Cluster, nil
	})
}

// ConsumerLeader asks the cluster ($JS.API.CONSUMER.INFO) which node leads
// the consumer of stream; each consumer has a leader of its own, which need
// not be the stream's.
func (c *Cluster) ConsumerLeader(ctx context.Context, js natsjs.JetStream, stream, consumer string) (int, error) {
	return leaderOf(ctx, stream+"/"+consumer, func(ctx context.Context) (*natsjs.ClusterInfo, error) {
		cons, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return nil, err
		}
		return cons.CachedInfo().Cluster, nil
	})
}

// leaderOf maps the leader that info reports for what to a node index.
func leaderOf(ctx context.Context, what string, info func(context.Context) (*natsjs.ClusterInfo, error)) (int, error) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ci, err := info(rctx)
	if err != nil {
		return -1, err
	}
	if ci == nil || ci.Leader == "" {
		return -1, fmt.Errorf("%w: %s has none", errNoLeader, what)
	}
	for i := range Size {
		if NodeName(i) == ci.Leader {
			return i, nil
		}
	}
	return -1, fmt.Errorf("opcluster: %s is led by unknown server %q", what, ci.Leader)
}
