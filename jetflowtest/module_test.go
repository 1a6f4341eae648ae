package jetflowtest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestOrderTestsModule runs the tests of examples/ordertests, a module of
// its own that imports only public packages and tests the order example
// with every feature of the kit, as a user's repository would: with its own
// go.mod and go.sum, read-only (the run fails if go.sum lacks a module it
// needs).
func TestOrderTestsModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests another module: not in -short")
	}
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "test", "-mod=readonly", "-count=1", "./...")
	cmd.Dir = filepath.Join("..", "examples", "ordertests")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	t.Logf("go test in %s:\n%s", cmd.Dir, out)
	if err != nil {
		t.Fatalf("the module's tests failed: %v", err)
	}
}
