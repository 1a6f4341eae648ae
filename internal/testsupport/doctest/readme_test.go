package doctest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeBlocks are the README's code blocks.
func readmeBlocks(t *testing.T) []Block {
	t.Helper()
	blocks, err := Blocks(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	return blocks
}

// sectionBlocks are the blocks of lang under the heading section.
func sectionBlocks(blocks []Block, section, lang string) []Block {
	var out []Block
	for _, b := range blocks {
		if b.Section == section && b.Lang == lang {
			out = append(out, b)
		}
	}
	return out
}

// goRun splits a documented `go run ./pkg args...` line into the package
// and its arguments (the docs quote nothing in such lines).
func goRun(t *testing.T, line string) (pkg string, args []string) {
	t.Helper()
	f := strings.Fields(line)
	require.GreaterOrEqual(t, len(f), 3, line)
	require.Equal(t, []string{"go", "run"}, f[:2], "not a go run command: %s", line)
	return f[2], f[3:]
}

// workerEnv isolates a worker started as a doc shows it: its own data
// directory, a NATS port and an operations port of its own (the documented
// defaults, 4222 and 8081, may be taken on a shared machine), JSON logs to
// read its addresses from.
func workerEnv(t *testing.T) []string {
	return cleanEnv("JETFLOW_DATA_DIR="+t.TempDir(), "JETFLOW_PORT=-1",
		"JETFLOW_OPS_ADDR=127.0.0.1:0", "JETFLOW_LOG_FORMAT=json")
}

// TestReadmeFirstCommands: the README opens with exactly two commands,
// each in its own block before the first section: the engine on an
// embedded NATS server with no setup, which serves until SIGTERM and then
// exits 0, and the tests, which are what CI runs.
func TestReadmeFirstCommands(t *testing.T) {
	t.Parallel()
	var first []Block
	for _, b := range readmeBlocks(t) {
		if b.Section == "# jetflow" {
			first = append(first, b)
		}
	}
	require.Len(t, first, 2, "the README's first lines give exactly two commands")
	var lines []string
	for _, b := range first {
		cmds := Commands(b)
		require.Len(t, cmds, 1, "%s: one command per block", b.Where())
		require.Equal(t, "sh", b.Lang, b.Where())
		lines = append(lines, cmds[0].Line)
	}

	pkg, args := goRun(t, lines[0])
	require.Equal(t, "./cmd/worker", pkg)
	require.Empty(t, args, "the first command needs no flags")
	w, _ := startWorker(t, args)
	w.stop()

	// The test command cannot run inside a test; it must be the one CI
	// runs (.ci/run), which is this package's caller.
	require.Regexp(t, `^go test -race( -timeout \d+m)? \./\.\.\.$`, lines[1])
	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci", "run"))
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(ci), "\n"), lines[1], "CI runs the README's test command exactly as written")
}

// TestReadmeTour runs the README's tour as a user would: the worker with
// the flags its block shows, then every command of the tour's and of the
// HTTP example's blocks through bash, each exiting 0 with the output its
// comment shows. The documented fixed addresses (NATS on 4222, the payment
// service on 8099, the HTTP API on 8080) are replaced by free ones.
func TestReadmeTour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the commands: not in -short")
	}
	t.Parallel()
	blocks := readmeBlocks(t)
	tour := sectionBlocks(blocks, "## A short tour", "sh")
	require.Len(t, tour, 2, "the tour: the worker's block, then the commands")

	workerCmds := Commands(tour[0])
	require.Len(t, workerCmds, 1, tour[0].Where())
	pkg, args := goRun(t, workerCmds[0].Line)
	require.Equal(t, "./cmd/worker", pkg)
	replace := map[string]string{}
	for i, a := range args {
		if a == "--payments-addr" && i+1 < len(args) {
			replace["http://"+args[i+1]] = "" // filled in below
			args[i+1] = "127.0.0.1:0"
		}
	}
	require.Len(t, replace, 1, "the tour's worker gets --payments-addr, so that curl knows where")
	w, natsURL := startWorker(t, args)
	payURL := str(t, w.waitFor("example payment service started in this process"), "url")
	for k := range replace {
		replace[k] = payURL
	}

	producer := goRunBinary(t, "./cmd/producer")
	env := cleanEnv("JETFLOW_NATS_URL=" + natsURL)
	runCommands(t, tour[1], producer, replace, env)

	http := sectionBlocks(blocks, "## Starting runs from anywhere", "sh")
	require.Len(t, http, 2, "the HTTP example: the server's block, then the requests")
	serveCmds := Commands(http[0])
	require.Len(t, serveCmds, 1, http[0].Where())
	require.Equal(t, "go run ./cmd/producer serve", serveCmds[0].Line)
	s, addr := startServe(t, producer, nil, env)
	runCommands(t, http[1], producer, map[string]string{"localhost:8080": addr}, env)

	s.stop()
	w.stop()
}

// runCommands runs the commands of a shell block in order, each through
// bash after the block's variable assignments, with `go run ./cmd/producer`
// replaced by the built producer and each key of replace by its value. Each
// must exit 0 with the output its comment shows.
func runCommands(t *testing.T, b Block, producer string, replace map[string]string, env []string) {
	t.Helper()
	assign := regexp.MustCompile(`^[A-Z][A-Z0-9_]*=`)
	var vars []string
	ran := 0
	for _, c := range Commands(b) {
		if assign.MatchString(c.Line) {
			vars = append(vars, c.Line)
			continue
		}
		line := strings.ReplaceAll(c.Line, "go run ./cmd/producer", producer)
		for k, v := range replace {
			line = strings.ReplaceAll(line, k, v)
		}
		require.NotEmpty(t, c.Want, "%s: %s: a tour command shows what it prints", b.Where(), c.Line)
		out := runBash(t, b.Where()+": "+c.Line, strings.Join(append(vars, line), "\n"), env)
		require.NoError(t, CheckOutput(out, c.Want), "%s: %s", b.Where(), c.Line)
		ran++
	}
	require.NotZero(t, ran, "%s has no commands", b.Where())
}

// TestReadmeCrash runs the tour's crash section as a user would: the crash
// demo exactly as its block shows it (from the repository's root; the
// script builds the binaries), then the payment service as a process of its
// own with a ledger, a worker charging through it (--payments-url) and the
// section's commands against them. The demo's fixed ports and the documented
// addresses are replaced by free ones. `TestCrashDemo` (examples/orders)
// checks the demo's numbers in detail; this test checks the README's line.
func TestReadmeCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the commands: not in -short")
	}
	t.Parallel()
	blocks := sectionBlocks(readmeBlocks(t), "### A crash, twice", "sh")
	require.Len(t, blocks, 4, "the crash demo, the payment service, the worker, the commands")

	demo := Commands(blocks[0])
	require.Len(t, demo, 1, blocks[0].Where())
	require.Regexp(t, `^CRASH_DEMO_ORDERS=[0-9]+ examples/orders/crash-demo.sh$`, demo[0].Line, blocks[0].Where())
	require.NotEmpty(t, demo[0].Want, "%s: the demo shows what it prints", blocks[0].Where())
	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	ports := freePorts(t, 3)
	env := append(cleanEnvWithout("CRASH_DEMO_"), "TMPDIR="+t.TempDir(),
		"CRASH_DEMO_NATS_PORT="+ports[0], "CRASH_DEMO_PAYMENTS_PORT="+ports[1], "CRASH_DEMO_API_PORT="+ports[2])
	out := runBash(t, blocks[0].Where(), "cd '"+root+"'\n"+demo[0].Line, env)
	require.NoError(t, CheckOutput(out, demo[0].Want), blocks[0].Where())

	payCmds := Commands(blocks[1])
	require.Len(t, payCmds, 1, blocks[1].Where())
	pkg, args := goRun(t, payCmds[0].Line)
	require.Equal(t, "./examples/orders/payments", pkg)
	replace := map[string]string{}
	for i, a := range args {
		if a == "--addr" && i+1 < len(args) {
			replace["http://"+args[i+1]] = "" // filled in below
			args[i+1] = "127.0.0.1:0"
		}
	}
	require.Len(t, replace, 1, "the payment service gets --addr, so that the worker and curl know where")
	require.Contains(t, args, "--ledger", "the payment service keeps a ledger")
	pay := startProc(t, t.TempDir(), goRunBinary(t, pkg), args, cleanEnv())
	payURL := str(t, pay.waitFor("payment service started"), "url")
	for k := range replace {
		replace[k] = payURL
	}

	workerCmds := Commands(blocks[2])
	require.Len(t, workerCmds, 1, blocks[2].Where())
	pkg, args = goRun(t, workerCmds[0].Line)
	require.Equal(t, "./cmd/worker", pkg)
	for i, a := range args {
		if r, ok := replace[a]; ok && i > 0 && args[i-1] == "--payments-url" {
			args[i] = r
		}
	}
	require.Contains(t, args, payURL, "the worker charges through the payment service (--payments-url)")
	w, natsURL := startWorker(t, args)
	require.Equal(t, payURL, str(t, w.waitFor("order workflow charges through the example payment service"), "payments_url"))

	runCommands(t, blocks[3], goRunBinary(t, "./cmd/producer"), replace, cleanEnv("JETFLOW_NATS_URL="+natsURL))
	w.stop()
	pay.stop()
}

// TestReadmeCrashFilesIgnored: the crash section's payment service keeps
// its ledger where git ignores it (a relative path under a directory the
// repository's .gitignore names), so that a reader who follows the
// section from the repository's root does not leave an untracked file in
// the tree. TestReadmeCrash runs the command itself.
func TestReadmeCrashFilesIgnored(t *testing.T) {
	t.Parallel()
	blocks := sectionBlocks(readmeBlocks(t), "### A crash, twice", "sh")
	require.NotEmpty(t, blocks)
	var ledger string
	for _, b := range blocks {
		for _, c := range Commands(b) {
			if !strings.HasPrefix(c.Line, "go run ./examples/orders/payments ") {
				continue
			}
			_, args := goRun(t, c.Line)
			for i, a := range args {
				if a == "--ledger" && i+1 < len(args) {
					ledger = args[i+1]
				}
			}
		}
	}
	require.NotEmpty(t, ledger, "the crash section runs the payment service with --ledger")
	require.False(t, filepath.IsAbs(ledger), "the ledger is in the tree the reader runs from: %s", ledger)
	patterns, err := os.ReadFile(filepath.Join(repoRoot, ".gitignore"))
	require.NoError(t, err)
	require.True(t, gitIgnored(string(patterns), ledger), "--ledger %s is not ignored by .gitignore:\n%s", ledger, patterns)
	// The matcher tells: the tree's own files, and the ledger the section
	// used to write in the root, are not ignored.
	for _, p := range []string{"README.md", "payments.jsonl", "examples/orders/payments.go"} {
		require.False(t, gitIgnored(string(patterns), p), p)
	}
}

// gitIgnored reports whether the .gitignore patterns ignore path (relative
// to the repository's root, slash-separated): the subset of gitignore's
// rules the repository uses — blank lines and # comments, a trailing "/"
// for directories only, a leading or inner "/" anchoring at the root,
// globs; no negation. A path is ignored when it, or a directory it is in,
// matches.
func gitIgnored(patterns, path string) bool {
	parts := strings.Split(filepath.ToSlash(filepath.Clean(path)), "/")
	for _, p := range strings.Split(patterns, "\n") {
		p = strings.TrimSpace(p)
		if p == "" || strings.HasPrefix(p, "#") || strings.HasPrefix(p, "!") {
			continue
		}
		dirOnly := strings.HasSuffix(p, "/")
		p = strings.TrimSuffix(p, "/")
		anchored := strings.Contains(p, "/")
		p = strings.TrimPrefix(p, "/")
		for i := range parts {
			if dirOnly && i == len(parts)-1 {
				break // the last part is the file itself
			}
			name := parts[i]
			if anchored {
				name = strings.Join(parts[:i+1], "/")
			}
			if ok, _ := filepath.Match(p, name); ok {
				return true
			}
		}
	}
	return false
}

// TestReadmeShellBlocksAreAllRun: every shell block of the README is in a
// section whose blocks a test runs (the first commands, the tour and its
// crash section, the go get line, the HTTP example), so a command added elsewhere fails here until a
// test runs it.
func TestReadmeShellBlocksAreAllRun(t *testing.T) {
	t.Parallel()
	run := map[string]bool{"# jetflow": true, "## A short tour": true, "### A crash, twice": true, "## Using it from Go": true, "## Starting runs from anywhere": true}
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.Lang == "sh" || b.Lang == "bash" || b.Lang == "shell" {
			require.True(t, run[b.Section], "%s: a shell block in %q, which no test runs", b.Where(), b.Section)
			n++
		}
	}
	require.Equal(t, 11, n, "the README's shell blocks: 2 first commands, 2 of the tour, 4 of its crash section, go get, 2 of the HTTP example")
}
