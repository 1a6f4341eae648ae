package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// engineJSONOf runs engine --output json and decodes it, with the exit code
// and stderr.
func engineJSONOf(t *testing.T, producer cliFunc) (jetflow.EngineStatus, int, string) {
	t.Helper()
	code, out, errOut := producer("engine", "--output", "json")
	var s jetflow.EngineStatus
	require.NoError(t, json.Unmarshal([]byte(out), &s), out)
	return s, code, errOut
}

// producer engine with a worker of this version live exits 0 and counts it
// under this version's protocol, with the runs under way by workflow and
// build. A live worker of another protocol, written into the roster as
// such a worker writes its liveness record, is reported by name, protocol
// and build, and the command exits 6 with a line on stderr saying what it
// waits for; once that worker is gone, a run of protocol 1 left makes it
// exit 7.
func TestEngine(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	this := strconv.Itoa(jetflow.EngineProtocol)

	// A run under way: inbox waits for its event, parked under the
	// testbed worker's build.
	code, _, errOut := producer("start", "inbox", `""`, "--id", "in-1")
	require.Equal(t, exitOK, code, errOut)
	var s jetflow.EngineStatus
	require.Eventually(t, func() bool {
		s, code, errOut = engineJSONOf(t, producer)
		return s.Builds["inbox"][blocktest.Build] == 1
	}, 30*time.Second, 10*time.Millisecond, "the parked run is not counted by its build: %+v", s.Builds)
	require.Equal(t, exitOK, code, errOut)
	require.Empty(t, errOut)
	require.Equal(t, jetflow.EngineStatus{
		Protocol: jetflow.EngineProtocol, Workers: map[string]int{this: 1}, Foreign: []jetflow.ForeignWorker{},
		Builds: map[string]map[string]int{"inbox": {blocktest.Build: 1}},
	}, s)

	code, out, errOut := producer("engine")
	require.Equal(t, exitOK, code, errOut)
	require.Empty(t, errOut)
	require.Equal(t, "engine protocol: "+this+" (this version)\n"+
		"live workers: 1 of protocol "+this+"\n"+
		"protocol 1 runs: 0 (runs of the executor before the lease not taken over yet)\n"+
		"protocol 1 messages: 0 (its tasks and timers left)\n"+
		"undecodable records: 0 (run records this version cannot read)\n"+
		"\nFOREIGN WORKER PROTOCOL BUILD LAST BEAT\n(none)\n"+
		"\nWORKFLOW BUILD RUNS UNDER WAY\ninbox "+blocktest.Build+" 1\n"+
		"\ndone: no worker of another engine protocol is live and nothing of protocol 1 is left\n", spaced(out))

	// A worker of another protocol joins: its liveness record, heartbeat
	// now.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := testenv.Conn(t, tb.srv)
	workflows, err := jetstream.LookupWorkflows(ctx, nc, jetstream.Topology{})
	require.NoError(t, err)
	beat := time.Now()
	rec, err := json.Marshal(roster.Live{Workflow: "greet", Worker: "old-worker", Since: beat, Beat: beat, Protocol: 2, Build: "v0.9", TTL: 10 * time.Second})
	require.NoError(t, err)
	key := roster.LiveKey("greet", "oldid")
	_, err = workflows.CreateTTL(ctx, key, rec, 10*time.Second)
	require.NoError(t, err)

	code, out, errOut = producer("engine")
	require.Equal(t, exitForeignWorkers, code, errOut)
	require.Contains(t, spaced(out), "live workers: 1 of protocol "+this+", 1 of protocol 2\n")
	require.Regexp(t, `\nFOREIGN WORKER PROTOCOL BUILD LAST BEAT\nold-worker 2 v0\.9 \d+s ago\n`, spaced(out))
	require.NotContains(t, out, "done:")
	require.Equal(t, "waiting for: 1 live worker(s) of another engine protocol to stop: old-worker (protocol 2); "+
		"workers of protocol "+this+" execute nothing beside them\n", errOut)
	s, code, _ = engineJSONOf(t, producer)
	require.Equal(t, exitForeignWorkers, code)
	require.False(t, s.Ready())
	require.True(t, s.OldWorkDone())
	require.Equal(t, map[string]int{this: 1, "2": 1}, s.Workers)
	require.Len(t, s.Foreign, 1)
	require.Equal(t, jetflow.ForeignWorker{Name: "old-worker", Protocol: 2, Build: "v0.9", Beat: s.Foreign[0].Beat}, s.Foreign[0])
	require.WithinDuration(t, beat, s.Foreign[0].Beat, time.Millisecond)

	// That worker is gone; a run of protocol 1 (a record without exec) is
	// left.
	_, err = workflows.Purge(ctx, key, 0)
	require.NoError(t, err)
	js, err := natsjs.New(nc)
	require.NoError(t, err)
	runs, err := js.KeyValue(ctx, jetstream.RunsBucket)
	require.NoError(t, err)
	_, err = runs.Create(ctx, "legacy-1", []byte(`{"v":1,"run_id":"legacy-1","workflow":"greet","input":{},"status":"running","token":"t"}`))
	require.NoError(t, err)
	code, out, errOut = producer("engine")
	require.Equal(t, exitOldWork, code, errOut)
	require.Contains(t, spaced(out), "\nprotocol 1 runs: 1 (")
	require.Contains(t, spaced(out), "\nFOREIGN WORKER PROTOCOL BUILD LAST BEAT\n(none)\n")
	require.Equal(t, "waiting for: protocol 1 (the executor before the lease): 1 run(s) not taken over yet, 0 task(s) or timer(s) left\n", errOut)
	s, code, _ = engineJSONOf(t, producer)
	require.Equal(t, exitOldWork, code)
	require.True(t, s.Ready())
	require.False(t, s.OldWorkDone())
	require.Equal(t, 1, s.LegacyRuns)

	code, _, errOut = producer("engine", "extra")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "engine takes no arguments")
}

// What engine waits for with both a foreign worker and work of protocol 1
// left: exit 6, both named; more than five foreign workers are counted,
// not all named.
func TestEngineWaitFor(t *testing.T) {
	t.Parallel()
	s := jetflow.EngineStatus{Protocol: 3, LegacyRuns: 2, LegacyMessages: 5}
	for i := range 7 {
		s.Foreign = append(s.Foreign, jetflow.ForeignWorker{Name: "w" + strconv.Itoa(i), Protocol: i % 2 * 2})
	}
	err := waitFor(s)
	var wait *upgradeWait
	require.ErrorAs(t, err, &wait)
	require.Equal(t, exitForeignWorkers, wait.code)
	require.Equal(t, "7 live worker(s) of another engine protocol to stop: w0 (protocol 0, an earlier version), w1 (protocol 2), "+
		"w2 (protocol 0, an earlier version), w3 (protocol 2), w4 (protocol 0, an earlier version), and 2 more; "+
		"workers of protocol 3 execute nothing beside them; "+
		"protocol 1 (the executor before the lease): 2 run(s) not taken over yet, 5 task(s) or timer(s) left", wait.what)
	require.NoError(t, waitFor(jetflow.EngineStatus{Protocol: 3}))

	// Names are printed escaped.
	var b bytes.Buffer
	require.NoError(t, (&printer{w: &b}).engine(jetflow.EngineStatus{Protocol: 3,
		Foreign: []jetflow.ForeignWorker{{Name: "a\x1b[31m", Protocol: 0, Beat: time.Now()}}}, time.Now()))
	require.Contains(t, b.String(), `a\x1b[31m`)
	require.Contains(t, spaced(b.String()), "live workers: none\n")
}

// spaced makes each run of blanks one space (tabwriter's padding).
func spaced(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}
