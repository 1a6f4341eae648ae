package opcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Proc is one child process whose output goes to a log file.
type Proc struct {
	Name string
	Log  string // path of the file holding its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit status, once done is closed
}

// StartProc starts bin with args and env (added to this process's
// environment), its output appended to <logDir>/<name>.log.
func StartProc(logDir, name string, env []string, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to be gone. Killing a
// process that already exited is not an error.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Term sends SIGTERM and waits up to timeout for the process to exit. It
// returns the exit error (nil for exit 0), or an error naming the timeout,
// after which the process is killed.
func (p *Proc) Term(timeout time.Duration) error { return p.Stop(syscall.SIGTERM, timeout) }

// Stop sends sig and waits up to timeout for the process to exit, as Term.
func (p *Proc) Stop(sig syscall.Signal, timeout time.Duration) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s after %v: %w (log %s)", p.Name, sig, p.err, p.Log)
		}
		return nil
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not exit within %s of %v (log %s)", p.Name, timeout, sig, p.Log)
	}
}

// WaitHTTP polls url until it answers 200, the process exits, or ctx
// ends.
func (p *Proc) WaitHTTP(ctx context.Context, url string) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before %s answered 200 (log %s):\n%s", p.Name, p.err, url, p.Log, p.tail(20))
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer 200: %w (log %s):\n%s", p.Name, url, ctx.Err(), p.Log, p.tail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail is the last n lines of the process's log, for an error message (the
// log's directory is gone once the test ends).
func (p *Proc) tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return "(log unreadable: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// FreePorts returns n TCP ports that were free on 127.0.0.1: each is bound
// to port 0 (the kernel picks a free one) and released once all n are
// picked, so the n are distinct. Another process could take one before it
// is used; a node that cannot bind its port fails to start and says so in
// its log.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Binaries are the executables the scenario runs.
type Binaries struct {
	NATSServer, Worker, Producer string
}

// Build builds nats-server from the version go.mod pins, cmd/worker (run
// with --payments-url, so that every charge any worker makes is counted
// outside the worker processes) and cmd/producer into dir. moduleRoot is the jetflow
// module's directory.
func Build(ctx context.Context, moduleRoot, dir string) (Binaries, error) {
	b := Binaries{
		NATSServer: filepath.Join(dir, "nats-server"),
		Worker:     filepath.Join(dir, "worker"),
		Producer:   filepath.Join(dir, "producer"),
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"github.com/nats-io/nats-server/v2", "./cmd/worker", "./cmd/producer")
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return b, fmt.Errorf("go build: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return b, nil
}
