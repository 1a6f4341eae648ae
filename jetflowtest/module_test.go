package jetflowtest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetflow/jetflow/internal/testsupport/doctest"
)

// TestOrderTestsModule runs the command docs/testing.md shows, which runs
// the tests of examples/ordertests: a module of its own that imports only
// public packages and tests the order example with every feature of the
// kit, as a user's repository would. It runs with the module's go.mod and
// go.sum read-only, so it fails if go.sum lacks a module the tests need.
func TestOrderTestsModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests another module: not in -short")
	}
	t.Parallel()
	blocks, err := doctest.Blocks(filepath.Join("..", "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []doctest.Command
	for _, b := range blocks {
		if b.Lang == "sh" {
			cmds = append(cmds, doctest.Commands(b)...)
		}
	}
	if len(cmds) != 1 {
		t.Fatalf("docs/testing.md shows %d shell commands, this test runs exactly one: %+v", len(cmds), cmds)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", cmds[0].Line)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -count=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", cmds[0].Line, out)
	if err != nil {
		t.Fatalf("the module's tests failed: %v", err)
	}
	if err := doctest.CheckOutput(string(out), cmds[0].Want); err != nil {
		t.Fatalf("the output docs/testing.md shows: %v", err)
	}
}
