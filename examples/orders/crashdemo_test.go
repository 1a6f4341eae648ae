package orders

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCrashDemo runs crash-demo.sh, as the docs show it, against the
// shipped binaries (built here once: worker, producer, payments,
// nats-server) with 300 orders, each started twice: the worker is
// SIGKILLed twice while charges are made but not answered, the steps that
// made them run again after the restart and are answered with replays, and
// every order is charged once.
func TestCrashDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds four binaries and runs them: not in -short")
	}
	t.Parallel()
	for _, tool := range []string{"go", "bash", "curl"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the demo needs %s", tool)
	}
	const orders = 300
	// Every allowance derives from the worker's AckWait: how long a
	// killed worker's steps wait before they are redelivered.
	const ackWait = time.Second
	phase := 60 * ackWait // the script's limit for each phase
	ctx, cancel := context.WithTimeout(t.Context(), 10*phase)
	defer cancel()

	bin := buildDemoBinaries(ctx, t)
	ports := freePorts(t, 3)
	script := exec.CommandContext(ctx, "bash", "crash-demo.sh")
	script.Env = append(environWithout("JETFLOW_", "CRASH_DEMO_"),
		"TMPDIR="+t.TempDir(),
		"CRASH_DEMO_BIN="+bin,
		"CRASH_DEMO_ORDERS="+strconv.Itoa(orders),
		"CRASH_DEMO_NATS_PORT="+strconv.Itoa(ports[0]),
		"CRASH_DEMO_PAYMENTS_PORT="+strconv.Itoa(ports[1]),
		"CRASH_DEMO_API_PORT="+strconv.Itoa(ports[2]),
		"CRASH_DEMO_ACK_WAIT="+ackWait.String(),
		"CRASH_DEMO_TIMEOUT="+strconv.Itoa(int(phase.Seconds())),
	)
	out, err := script.CombinedOutput()
	t.Logf("crash-demo.sh:\n%s", out)
	require.NoError(t, err)

	kills := regexp.MustCompile(`(?m)^worker SIGKILLed at (\d+) of (\d+) charges, (\d+) or more of them not yet answered$`).
		FindAllStringSubmatch(string(out), -1)
	require.Len(t, kills, 2, "two kills")
	unanswered := 0
	for i, k := range kills {
		at, held := atoi(t, k[1]), atoi(t, k[3])
		require.Equal(t, orders, atoi(t, k[2]))
		// Answers are held from charge (i+1)/3 of the orders on.
		require.GreaterOrEqual(t, at, orders*(i+1)/3, "kill %d came after its third of the charges", i+1)
		require.Positive(t, held, "kill %d came while a charge was made and not answered", i+1)
		unanswered += held
	}
	replays := regexp.MustCompile(`(?m)^(\d+) charge requests were answered with the charge already made \(replays\)$`).
		FindStringSubmatch(string(out))
	require.NotNil(t, replays)
	require.GreaterOrEqual(t, atoi(t, replays[1]), unanswered, "every step killed before its answer charged again, and was replayed")
	require.Contains(t, string(out), "a start asking for a generated run ID: 400 (order requires the caller's run ID)\n")
	require.Contains(t, string(out), fmt.Sprintf("\n%d starts: %d answered 201\n", 2*orders, 2*orders))
	require.True(t, strings.HasSuffix(string(out), fmt.Sprintf("\n%d orders, %d charges, 0 duplicates\n", orders, orders)),
		"the last line is the verdict")
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// buildDemoBinaries builds the binaries crash-demo.sh runs into a
// directory of the test's and returns it.
func buildDemoBinaries(ctx context.Context, t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"-o", dir + string(filepath.Separator), "./cmd/worker", "./cmd/producer", "./examples/orders/payments"},
		{"-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
	} {
		build := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
		build.Dir = filepath.Join("..", "..")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "go build %v:\n%s", args, out)
	}
	return dir
}

// freePorts returns n TCP ports free on 127.0.0.1 a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close() // held until all are chosen, so that they differ
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// environWithout is the test's environment without the variables whose
// names start with one of prefixes.
func environWithout(prefixes ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}
