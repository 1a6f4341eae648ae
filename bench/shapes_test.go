package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/doctest"
)

// TestTapCountsOperations: the tap counts what clients send by kind (KV
// writes and reads per bucket, task publishes, pull requests, acks) and
// counts a consumer's delivery apart, not as a message a client sent.
func TestTapCountsOperations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	e := testEnv(t)
	tp, err := newTap(e)
	require.NoError(t, err)
	nc, err := e.conn("client")
	require.NoError(t, err)
	js, err := natsjs.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: "bench_tap"})
	require.NoError(t, err)
	stream, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: "BENCH_TAP", Subjects: []string{"benchtap.>"}})
	require.NoError(t, err)
	cons, err := stream.CreateConsumer(ctx, natsjs.ConsumerConfig{Durable: "c", AckPolicy: natsjs.AckExplicitPolicy})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "benchtap.a", []byte("x"))
	require.NoError(t, err)
	// The set-up's messages (the publish above among them) reach the tap
	// before the reset, not after it on a loaded machine.
	_, err = tp.snapshot(ctx)
	require.NoError(t, err)

	tp.reset()
	for range 2 {
		_, err := kv.Put(ctx, "k", []byte("v"))
		require.NoError(t, err)
	}
	for range 3 {
		_, err := kv.Get(ctx, "k")
		require.NoError(t, err)
	}
	for range 2 {
		require.NoError(t, nc.Publish("jetflow.task.wf.run", nil))
	}
	batch, err := cons.Fetch(1, natsjs.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	got := 0
	for m := range batch.Messages() {
		require.NoError(t, m.Ack())
		got++
	}
	require.NoError(t, batch.Error())
	require.Equal(t, 1, got)
	require.NoError(t, nc.Flush())
	ops, err := tp.snapshot(ctx)
	require.NoError(t, err)

	require.Equal(t, 2.0, ops[opWrite], "%v", ops)
	require.Equal(t, 2.0, ops[opWrite+" bench_tap"], "%v", ops)
	require.Equal(t, 3.0, ops[opRead], "%v", ops)
	require.Equal(t, 3.0, ops[opRead+" bench_tap"], "%v", ops)
	require.Equal(t, 2.0, ops[opTask], "%v", ops)
	require.Equal(t, 1.0, ops[opPull], "%v", ops)
	require.Equal(t, 1.0, ops[opAck], "%v", ops)
	require.Equal(t, 1.0, ops[opDelivery], "%v", ops)
	require.Equal(t, 9.0, ops[opTotal], "the delivery is not a message a client sent: %v", ops)

	// Closed, the tap no longer receives (nor costs the server) a copy
	// of every message: a message another subscriber got is not counted.
	tp.close()
	require.True(t, tp.nc.IsClosed())
	sub, err := nc.SubscribeSync("jetflow.task.>")
	require.NoError(t, err)
	require.NoError(t, nc.Publish("jetflow.task.wf.run2", nil))
	_, err = sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	tp.mu.Lock()
	defer tp.mu.Unlock()
	require.Equal(t, 2.0, tp.counts[opTask])
}

// TestShapePhasesRun: the fanout and deep phases run their workflows to
// completion (every run record is checked for its output), count each
// step's operations, and report them per step and per parallel branch.
func TestShapePhasesRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cfg := config{
		starters: 4, concurrency: 8, repeat: 1, timeout: 2 * time.Minute,
		fanoutRuns: 3, fanoutWidth: 4, deepRuns: 2, deepSteps: 8, shapeWorkers: 2,
		phases: map[string]bool{"fanout": true, "deep": true},
	}
	require.NoError(t, run(ctx, cfg))
	require.Len(t, fanoutResults, 1)
	require.Len(t, deepResults, 1)

	f := fanoutResults[0]
	require.Equal(t, 3*(cfg.fanoutWidth+2), f.shape.steps)
	require.Positive(t, f.shape.cpu)
	// Every step of a run is committed with one write to the steps
	// bucket, and every parallel branch is a task of its own.
	steps := float64(cfg.fanoutWidth + 2)
	require.GreaterOrEqual(t, f.opsShape[opWrite+" jetflow_steps"], steps, "%v", f.opsShape)
	require.GreaterOrEqual(t, f.opsNarrow[opWrite+" jetflow_steps"], 3.0, "%v", f.opsNarrow)
	require.GreaterOrEqual(t, f.opsRef[opWrite+" jetflow_steps"], 3.0, "%v", f.opsRef)
	require.GreaterOrEqual(t, f.opsShape[opTask], float64(cfg.fanoutWidth), "%v", f.opsShape)

	d := deepResults[0]
	require.Equal(t, 2*cfg.deepSteps, d.shape.steps)
	require.GreaterOrEqual(t, d.opsShape[opWrite+" jetflow_steps"], float64(cfg.deepSteps), "%v", d.opsShape)
	// One holder runs a run's sequential steps in one pass of the body:
	// a run of n steps makes n Step calls (2n when a task had to be taken
	// over), not the n(n+1)/2 of a replay per step.
	require.GreaterOrEqual(t, d.shape.bodyCalls, int64(2*cfg.deepSteps))
	require.LessOrEqual(t, d.shape.bodyCalls, int64(2*2*cfg.deepSteps))
	require.Positive(t, d.early)
	require.Positive(t, d.late)

	var out bytes.Buffer
	printShapeReports(&out, &results{cfg: cfg})
	for _, want := range []string{"fan-out steps/s", "kv read per parallel branch", "deep steps/s", "CPU per step", "time per step, last 4 steps of a run"} {
		require.Contains(t, out.String(), want)
	}
}

// TestReadmeBenchCommandsParse: every `go run ./bench` command the README
// shows (but the soak's, which has flags of its own) is accepted by the
// bench's flag parser, so a renamed or removed flag breaks this test
// rather than the README.
func TestReadmeBenchCommandsParse(t *testing.T) {
	t.Parallel()
	blocks, err := doctest.Blocks("README.md")
	require.NoError(t, err)
	checked := 0
	for _, b := range blocks {
		if b.Lang != "sh" {
			continue
		}
		for _, c := range doctest.Commands(b) {
			line, _, _ := strings.Cut(c.Line, "&&")
			args, ok := strings.CutPrefix(strings.TrimSpace(line), "go run ./bench")
			if !ok || strings.HasPrefix(strings.TrimSpace(args), "soak") {
				continue
			}
			_, err := parseFlags(strings.Fields(args))
			require.NoError(t, err, "%s: %s", b.Where(), c.Line)
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, 7, "the README's bench commands")
	_, err = parseFlags([]string{"--phases", "fanout,nope"})
	require.ErrorContains(t, err, `unknown phase "nope"`)
}
