package doctest

import (
	"crypto/rand"
	"encoding/base64"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHTTPDocCommands runs every shell block of docs/http.md, in order, as
// the page says: against the example worker and `producer serve`. A block
// that starts `producer serve` (with the environment and flags it shows)
// replaces the running server; any other block runs as one bash script
// against the current server, and must print every fragment of its
// comments and of the output block that follows it (each line of which may
// leave lines out), in order, on its standard output.
func TestHTTPDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the commands: not in -short")
	}
	t.Parallel()
	blocks, err := Blocks(filepath.Join(repoRoot, "docs", "http.md"))
	require.NoError(t, err)

	w, natsURL := startWorker(t, nil)
	producer := goRunBinary(t, "./cmd/producer")

	secret := make([]byte, 24)
	_, err = rand.Read(secret)
	require.NoError(t, err)
	// The secrets deploy/webhooks.example.yaml reads, for the server and
	// for the scripts that sign deliveries.
	env := cleanEnv("JETFLOW_NATS_URL="+natsURL,
		"USERS_WEBHOOK_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret),
		"STRIPE_WEBHOOK_SECRET=whsec_doctest", "GITHUB_WEBHOOK_SECRET=doctest", "GITHUB_WEBHOOK_SECRET_OLD=doctest-old")
	s, addr := startServe(t, producer, nil, env)

	scripts := 0
	for i, b := range blocks {
		if b.Lang != "sh" {
			continue
		}
		if vars, args, ok := serveCommand(t, b); ok {
			s.stop()
			s, addr = startServe(t, producer, args, slices.Concat(env, vars))
			continue
		}
		var want []string
		for _, c := range Commands(b) {
			want = append(want, c.Want...)
		}
		if i+1 < len(blocks) && blocks[i+1].Lang == "" {
			for _, line := range strings.Split(blocks[i+1].Text, "\n") {
				want = append(want, Fragments(line)...) // a shown output block leaves lines out
			}
		}
		require.NotEmpty(t, want, "%s: the block shows what it prints (a comment or an output block)", b.Where())
		out := runBash(t, b.Where(), strings.ReplaceAll(b.Text, "localhost:8080", addr), env)
		require.NoError(t, CheckOutput(out, want), b.Where())
		scripts++
	}
	require.GreaterOrEqual(t, scripts, 7, "docs/http.md's examples")
	s.stop()
	w.stop()
}

// serveCommand reports whether b is one `[VAR=value ...] go run
// ./cmd/producer serve [flags]` line, and returns its variables and flags.
func serveCommand(t *testing.T, b Block) (vars, args []string, ok bool) {
	t.Helper()
	cmds := Commands(b)
	if len(cmds) != 1 {
		return nil, nil, false
	}
	f := strings.Fields(cmds[0].Line)
	for len(f) > 0 && strings.Contains(f[0], "=") {
		vars, f = append(vars, f[0]), f[1:]
	}
	if len(f) < 4 || strings.Join(f[:4], " ") != "go run ./cmd/producer serve" {
		return nil, nil, false
	}
	return vars, f[4:], true
}
