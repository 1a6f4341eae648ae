package layers

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// minGo is the lowest Go release jetflow builds with, the go directive of
// go.mod: the highest one that the modules jetflow's packages need declare
// (nats-server, nats.go, golang.org/x/..., OpenTelemetry and the Prometheus
// client all say go 1.26.0); jetflow's own code needs no more. go.mod's
// toolchain line names the release the project develops and tests with.
// A team's module that requires jetflow must declare at least this, so
// raising it is a decision, not a side effect of go mod tidy: it changes
// here, in the README, the CHANGELOG, the example modules' go.mod and
// .ci/run's GOTOOLCHAIN together.
const minGo = "1.26.0"

// goModLine is the value of the first line of a go.mod that starts with
// the directive name ("go", "toolchain"), or "" when there is none.
func goModLine(t *testing.T, gomod []byte, name string) string {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	require.NoError(t, sc.Err())
	return ""
}

// go.mod declares the floor, not the release the project happens to
// develop with (that is the toolchain line); so do the example modules,
// which are written as a team's module would be and which CI builds with
// the floor's toolchain.
func TestGoDirectiveIsTheFloor(t *testing.T) {
	t.Parallel()
	gomod, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	require.Equal(t, minGo, goModLine(t, gomod, "go"),
		"go.mod's go directive is the floor every team importing jetflow must meet: "+
			"raise it only on purpose (minGo, README, CHANGELOG, examples' go.mod, .ci/run), never through go mod tidy after a dependency update")
	require.NotEmpty(t, goModLine(t, gomod, "toolchain"), "go.mod names the release the project develops with on a toolchain line")
	for _, m := range []string{"customworker", "ordertests"} {
		b, err := os.ReadFile(filepath.Join("../../examples", m, "go.mod"))
		require.NoError(t, err)
		require.Equal(t, minGo, goModLine(t, b, "go"), "examples/%s/go.mod, a team's module, declares the floor", m)
	}
}

// A team's module on the floor: declaring go 1.26.0 and requiring jetflow
// (replaced by this repository), go mod tidy on this newer Go leaves its go
// directive as it is and adds no toolchain line, and the floor's own
// toolchain, fetched through the module proxy as GOTOOLCHAIN does, builds
// and runs a program that imports jetflow. A dependency, or jetflow's own
// go.mod, asking for a newer Go fails both.
func TestTeamModuleOnTheFloorGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with another Go toolchain: not in -short")
	}
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	dir := t.TempDir()
	gomod := "module example.com/team\n\ngo " + minGo + "\n\nrequire " + module + " v0.0.0\n\nreplace " + module + " => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	const program = `package main

import (
	"fmt"
	"runtime"

	"github.com/jetflow/jetflow"
)

func main() { fmt.Println(runtime.Version(), jetflow.StatusCompleted) }
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644))

	// goCmd runs the go command in the module with the toolchain named
	// (GOTOOLCHAIN), the proxy as the environment has it.
	goCmd := func(toolchain string, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN="+toolchain)
		return cmd.CombinedOutput()
	}

	out, err := goCmd("local", "mod", "tidy")
	require.NoError(t, err, "go mod tidy:\n%s", out)
	tidied, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	require.Equal(t, minGo, goModLine(t, tidied, "go"), "go mod tidy changed the team's go directive:\n%s", tidied)
	require.Empty(t, goModLine(t, tidied, "toolchain"), "go mod tidy added a toolchain line:\n%s", tidied)

	floor := "go" + minGo
	if out, err := goCmd(floor, "version"); err != nil {
		t.Skipf("the %s toolchain could not be obtained through the module proxy (GOPROXY=%q): %v\n%s",
			floor, os.Getenv("GOPROXY"), err, out)
	}
	bin := filepath.Join(t.TempDir(), "team")
	out, err = goCmd(floor, "build", "-o", bin, ".")
	require.NoError(t, err, "go build with %s:\n%s", floor, out)
	out, err = exec.CommandContext(ctx, bin).Output()
	require.NoError(t, err)
	require.Equal(t, floor+" completed\n", string(out), "the program was built by the floor's toolchain")
}
