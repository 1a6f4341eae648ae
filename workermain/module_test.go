package workermain

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/embedded"
)

// TestCustomWorkerModule builds examples/customworker, a module of its own
// that uses only the public packages, runs its binary against an embedded
// server, completes a run of its workflow through jetflow.Connect and
// StartByName, and stops the worker with SIGTERM: it drains and exits 0.
func TestCustomWorkerModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module: not in -short")
	}
	t.Parallel()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// Build with the module's own go.mod and go.sum, read-only: the build
	// fails if go.sum lacks a module the example needs.
	bin := filepath.Join(t.TempDir(), "customworker")
	build := exec.CommandContext(ctx, goTool, "build", "-mod=readonly", "-buildvcs=false", "-o", bin, ".")
	build.Dir = filepath.Join("..", "examples", "customworker")
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)

	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)

	worker := exec.Command(bin, "--nats-url", srv.ClientURL(), "--ops-addr=", "--log-format", "json")
	worker.Env = []string{"PATH=" + os.Getenv("PATH")} // no JETFLOW_* from the test's environment
	stderr, err := worker.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, worker.Start())
	var exitErr error
	exited := make(chan struct{}) // closed once exitErr is set
	started := make(chan struct{})
	go func() {
		defer close(exited)
		// Log the worker's lines; say when it has started. Wait after
		// the pipe's end, as exec requires.
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
			var line struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "worker started" {
				close(started)
			}
		}
		exitErr = worker.Wait()
	}()
	t.Cleanup(func() {
		_ = worker.Process.Kill() // if the test failed before the SIGTERM
		<-exited
	})
	select {
	case <-started:
	case <-exited:
		t.Fatalf("the worker exited before it started: %v", exitErr)
	case <-ctx.Done():
		t.Fatal("the worker did not start in time")
	}

	nc, err := jetflow.Connect(srv.ClientURL(), nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	input := json.RawMessage(`{"user_id":"u-42","email":"ada@example.com"}`)
	res, err := c.StartByName(ctx, "welcome", input, jetflow.WithRunID("signup-u-42"))
	require.NoError(t, err)
	require.Equal(t, jetflow.OutcomeCreated, res.Outcome)
	run, err := c.WaitRun(ctx, "signup-u-42")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	var welcomed struct {
		UserID         string `json:"user_id"`
		ProfileID      string `json:"profile_id"`
		MessageID      string `json:"message_id"`
		IdempotencyKey string `json:"idempotency_key"`
		Recorded       bool   `json:"recorded"`
	}
	require.NoError(t, json.Unmarshal(run.Output, &welcomed))
	require.Equal(t, "u-42", welcomed.UserID)
	require.Equal(t, "profile-u-42", welcomed.ProfileID)
	require.Equal(t, "msg-1", welcomed.MessageID)
	require.Equal(t, "signup-u-42.send-welcome-email.0", welcomed.IdempotencyKey)
	require.True(t, welcomed.Recorded)

	// SIGTERM drains and exits 0.
	require.NoError(t, worker.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		require.NoError(t, exitErr, "exit status after SIGTERM")
	case <-ctx.Done():
		t.Fatal("the worker did not exit after SIGTERM")
	}
}
