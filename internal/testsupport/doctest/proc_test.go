package doctest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../../.."

// cmdTimeout bounds every build, command and wait of these tests: a
// program a doc shows must be built, started, answer and stop within it on
// a loaded machine.
const cmdTimeout = 3 * time.Minute

var binDir string // binaries built by goRunBinary, removed by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jetflow-doctest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// goRunBinary builds the repository's package pkg ("./cmd/worker") once
// for the whole test binary and returns the binary's path: what
// `go run pkg` runs.
func goRunBinary(t *testing.T, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[pkg]; ok {
		return bin
	}
	bin := filepath.Join(binDir, strings.ReplaceAll(strings.Trim(pkg, "./"), "/", "_"))
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", pkg, out)
	built[pkg] = bin
	return bin
}

// cleanEnv is the test's environment without JETFLOW_* settings, plus
// extra ("K=V").
func cleanEnv(extra ...string) []string {
	return append(cleanEnvWithout(), extra...)
}

// cleanEnvWithout is the test's environment without JETFLOW_* settings and
// without the variables whose names start with one of prefixes.
func cleanEnvWithout(prefixes ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range append(prefixes, "JETFLOW_") {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

// freePorts returns n TCP ports free on 127.0.0.1 a moment ago, for
// commands that take a port, not an address.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	ports := make([]string, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close() // held until all are chosen, so that they differ
		ports[i] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// proc is a long-running command a doc shows (a worker, a server), with
// the JSON log lines it wrote to stdout or stderr.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []map[string]any
	changed chan struct{} // closed and replaced when lines grows or the process exits
	exited  bool
	waitErr error
	done    chan struct{} // closed once the process has exited and its output is read
}

// startProc starts bin with args and env in the directory dir ("" for the
// test's); the process is killed at the end of the test if it still runs.
func startProc(t *testing.T, dir, bin string, args, env []string) *proc {
	t.Helper()
	p := &proc{t: t, changed: make(chan struct{}), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Dir = dir
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	require.NoError(t, p.cmd.Start(), "%s %v", bin, args)
	go func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		_ = pw.Close() // ends the reader, which then closes done
	}()
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			t.Logf("%s: %s", filepath.Base(bin), sc.Text())
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				line = map[string]any{"message": sc.Text()}
			}
			p.mu.Lock()
			p.lines = append(p.lines, line)
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.exited = true
		close(p.changed)
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // if the test failed before stop
		<-p.done
	})
	return p
}

// waitFor returns the first log line whose message is msg, waiting for it
// at most cmdTimeout; it fails the test if the process exits first.
func (p *proc) waitFor(msg string) map[string]any {
	p.t.Helper()
	deadline := time.NewTimer(cmdTimeout)
	defer deadline.Stop()
	for seen := 0; ; {
		p.mu.Lock()
		lines, exited, changed := p.lines, p.exited, p.changed
		p.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if lines[seen]["message"] == msg {
				return lines[seen]
			}
		}
		if exited {
			p.t.Fatalf("%s exited before logging %q", p.cmd.Path, msg)
		}
		select {
		case <-changed:
		case <-deadline.C:
			p.t.Fatalf("%s did not log %q within %s", p.cmd.Path, msg, cmdTimeout)
		}
	}
}

// stop sends SIGTERM, as Ctrl-C or a process manager would, and requires
// the process to exit with status 0 within cmdTimeout.
func (p *proc) stop() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(cmdTimeout):
		p.t.Fatalf("%s did not exit within %s of SIGTERM", p.cmd.Path, cmdTimeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NoError(p.t, p.waitErr, "%s after SIGTERM", p.cmd.Path)
}

// runBash runs script with bash -e in env, within cmdTimeout, and returns
// its standard output; it fails the test (showing stderr) unless the script
// exits 0.
func runBash(t *testing.T, where, script string, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Env = env
	var stderr strings.Builder // curl's progress meter, errors
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s:\n%s%s", where, out, stderr.String())
	return string(out)
}

// startWorker starts the worker command (./cmd/worker) as a doc shows it,
// with args, isolated by workerEnv, and returns it once it serves, with the
// URL of its embedded NATS server.
func startWorker(t *testing.T, args []string) (*proc, string) {
	t.Helper()
	w := startProc(t, "", goRunBinary(t, "./cmd/worker"), args, workerEnv(t))
	natsURL := str(t, w.waitFor("embedded NATS server started"), "url")
	w.waitFor("worker started")
	return w, natsURL
}

// startServe starts `producer serve` with args in env, from the repository's
// root (a doc's relative paths are the root's), on a free address, and
// returns it once it serves, with that address.
func startServe(t *testing.T, producer string, args, env []string) (*proc, string) {
	t.Helper()
	s := startProc(t, repoRoot, producer, append([]string{"serve"}, args...),
		slices.Concat(env, []string{"JETFLOW_HTTP_ADDR=127.0.0.1:0", "JETFLOW_LOG_FORMAT=json"}))
	return s, str(t, s.waitFor("serving the API on /v1/ and /metrics /healthz /readyz"), "addr")
}

// str is the string field k of a log line, which must be present.
func str(t *testing.T, line map[string]any, k string) string {
	t.Helper()
	v, ok := line[k].(string)
	require.True(t, ok, "log line %v has no string %q", line, k)
	return v
}
