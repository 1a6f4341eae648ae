package jetflow

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// docCommand is one `nats ...` line of a doc and the answer the doc shows
// under it (empty when it shows none).
type docCommand struct {
	line string
	args []string
	want []string
}

// docNATSCommands reads the fenced blocks of section (a "## " heading) of
// the markdown file path: each line starting "nats " is a command, and the
// lines right after it, up to a blank line or the next command, are its
// answer.
func docNATSCommands(t *testing.T, path, section string) []docCommand {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n"+section+"\n")
	require.NotEqual(t, -1, start, "%s has no section %q", path, section)
	body := doc[start+len(section)+2:]
	if end := strings.Index(body, "\n## "); end >= 0 {
		body = body[:end]
	}
	var cmds []docCommand
	inBlock, inAnswer := false, false
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock, inAnswer = !inBlock, false
		case !inBlock:
		case strings.HasPrefix(line, "nats "):
			args, err := shellSplit(line)
			require.NoError(t, err, line)
			cmds = append(cmds, docCommand{line: line, args: args[1:]})
			inAnswer = true
		case strings.TrimSpace(line) == "":
			inAnswer = false
		case inAnswer:
			c := &cmds[len(cmds)-1]
			c.want = append(c.want, line)
		default:
			t.Fatalf("%s: a line in a code block that is neither a nats command nor its answer: %q", path, line)
		}
	}
	require.NoError(t, sc.Err())
	return cmds
}

// shellSplit splits a command line as a POSIX shell would for the quoting
// the docs use: blanks separate words, single quotes quote verbatim.
func shellSplit(line string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote bool
	)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote && c == '\'':
			quote = false
		case quote:
			cur.WriteByte(c)
		case c == '\'':
			quote, in = true, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case c == '"' || c == '\\' || c == '$' || c == '`':
			return nil, errors.New("unsupported shell syntax " + string(c))
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if quote {
		return nil, errors.New("unterminated quote")
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// docOrder is the input of the stand-in for the example order workflow.
type docOrder struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Email       string `json:"email"`
}

// Every nats CLI command of docs/protocol.md's examples runs, in order,
// against a worker serving a workflow named order, with the effect and the
// answer the doc shows. The commands are executed with nats.go, as the CLI
// would send them.
func TestProtocolDocExamplesRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const served = "order"
	// Like the example order workflow, it requires its caller's run ID.
	env.worker(WorkerConfig{}, NewWorkflow(served, func(ctx *Context, in docOrder) (string, error) {
		return Step(ctx, "charge", func(context.Context) (string, error) { return "ch_" + in.OrderID, nil })
	}, RequireRunID()))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	cmds := docNATSCommands(t, "docs/protocol.md", "## Examples with the `nats` CLI")
	require.NotEmpty(t, cmds)
	var started []string // run IDs of starts of the served workflow
	published := map[string]bool{}
	for _, c := range cmds {
		t.Logf("$ %s", c.line)
		// As a reader would: the runs started so far have ended.
		for _, id := range started {
			docRunEnded(t, js, id)
		}
		ctx := ctxT(t, 10*time.Second)
		args := c.args
		switch {
		case len(args) >= 3 && args[0] == "pub":
			subject, body := args[1], args[2]
			m := nats.NewMsg(subject)
			m.Data = []byte(body)
			jetStream := false
			for i := 3; i < len(args); i++ {
				switch {
				case args[i] == "-H" && i+1 < len(args):
					k, v, ok := strings.Cut(args[i+1], ":")
					require.True(t, ok, c.line)
					m.Header.Set(k, v)
					i++
				case args[i] == "--jetstream":
					jetStream = true
				default:
					t.Fatalf("%s: flag %s not exercised", c.line, args[i])
				}
			}
			require.True(t, jetStream, "%s: a start must go through JetStream", c.line)
			ack, err := js.PublishMsg(ctx, m)
			require.NoError(t, err, c.line)
			require.Equal(t, "JETFLOW_STARTS", ack.Stream)
			require.Equal(t, published[c.line], ack.Duplicate, "%s: a repeat is absorbed by the broker, a first publish is not", c.line)
			published[c.line] = true
			if subject == "jetflow.start."+served {
				started = append(started, docRunID(t, body, m.Header.Get("Nats-Msg-Id")))
			}
			require.Empty(t, c.want, "%s: no answer checked for pub", c.line)
		case len(args) == 3 && args[0] == "request":
			reply, err := nc.Request(args[1], []byte(args[2]), 10*time.Second)
			require.NoError(t, err, c.line)
			require.Len(t, c.want, 1, "%s: one answer line", c.line)
			var got, want map[string]any
			require.NoError(t, json.Unmarshal(reply.Data, &got), string(reply.Data))
			require.NoError(t, json.Unmarshal([]byte(c.want[0]), &want), c.want[0])
			docMatch(t, c.line, want, got)
			if id, ok := got["run_id"].(string); ok && got["outcome"] != nil {
				started = append(started, id)
			}
		case len(args) == 5 && args[0] == "kv" && args[1] == "get" && args[4] == "--raw":
			kv, err := js.KeyValue(ctx, args[2])
			require.NoError(t, err, c.line)
			e, err := kv.Get(ctx, args[3])
			require.NoError(t, err, c.line)
			var v map[string]any
			require.NoError(t, json.Unmarshal(e.Value(), &v), c.line)
			require.Empty(t, c.want, "%s: no answer checked", c.line)
		case len(args) == 4 && args[0] == "kv" && args[1] == "watch":
			kv, err := js.KeyValue(ctx, args[2])
			require.NoError(t, err, c.line)
			w, err := kv.Watch(ctx, args[3])
			require.NoError(t, err, c.line)
			select {
			case e := <-w.Updates():
				require.NotNil(t, e, "%s: the key has a value", c.line)
				var v map[string]any
				require.NoError(t, json.Unmarshal(e.Value(), &v))
				require.Equal(t, "completed", v["status"], c.line)
			case <-ctx.Done():
				t.Fatalf("%s: no value", c.line)
			}
			require.NoError(t, w.Stop())
		case len(args) == 3 && args[0] == "stream" && args[1] == "info":
			st, err := js.Stream(ctx, args[2])
			require.NoError(t, err, c.line)
			_, err = st.Info(ctx)
			require.NoError(t, err, c.line)
		case len(args) == 4 && args[0] == "stream" && args[1] == "subjects":
			st, err := js.Stream(ctx, args[2])
			require.NoError(t, err, c.line)
			_, err = st.Info(ctx, natsjs.WithSubjectFilter(args[3]))
			require.NoError(t, err, c.line)
		case len(args) == 6 && args[0] == "stream" && args[1] == "purge" && args[3] == "--subject" && args[5] == "-f":
			st, err := js.Stream(ctx, args[2])
			require.NoError(t, err, c.line)
			require.NoError(t, st.Purge(ctx, natsjs.WithPurgeSubject(args[4])), c.line)
			info, err := st.Info(ctx, natsjs.WithSubjectFilter(args[4]))
			require.NoError(t, err)
			require.Zero(t, info.State.Subjects[args[4]], "%s: purged", c.line)
		case len(args) == 4 && args[0] == "consumer" && args[1] == "info":
			cons, err := js.Consumer(ctx, args[2], args[3])
			require.NoError(t, err, c.line)
			_, err = cons.Info(ctx)
			require.NoError(t, err, c.line)
		default:
			t.Fatalf("docs/protocol.md shows %q, which this test does not exercise: teach it", c.line)
		}
	}
	for _, id := range started {
		docRunEnded(t, js, id)
	}
	require.Contains(t, started, "order-44", "the corrected envelope was admitted")
}

// docRunID is the run ID a durable start names.
func docRunID(t *testing.T, body, msgID string) string {
	t.Helper()
	var env struct {
		RunID string `json:"run_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &env))
	if env.RunID != "" {
		return env.RunID
	}
	return msgID
}

// docRunEnded waits until the run record of id is final.
func docRunEnded(t *testing.T, js natsjs.JetStream, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		rec, ok := getJSON(t, js, "jetflow_runs", id)
		return ok && rec["status"] != "running"
	}, 20*time.Second, 10*time.Millisecond, "run %s never ended", id)
}

// docMatch compares an answer with the one a doc shows: the same keys and
// values, where a string ending in "..." in the doc matches any string that
// starts with what precedes it, and "<generated>" any non-empty string.
func docMatch(t *testing.T, line string, want, got any) {
	t.Helper()
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		require.True(t, ok, "%s: want an object, got %v", line, got)
		keys := func(m map[string]any) []string {
			var out []string
			for k := range m {
				out = append(out, k)
			}
			return out
		}
		require.ElementsMatch(t, keys(w), keys(g), "%s: fields of the answer %v", line, got)
		for k, v := range w {
			docMatch(t, line+" ."+k, v, g[k])
		}
	case string:
		g, ok := got.(string)
		require.True(t, ok, "%s: want a string, got %v", line, got)
		switch {
		case w == "<generated>":
			require.NotEmpty(t, g, line)
		case w == "running" && strings.HasSuffix(line, " .status"):
			// A start's reply is built after the run was created; a fast
			// worker may have completed it by then.
			require.Contains(t, []string{"running", "completed"}, g, line)
		case strings.HasSuffix(w, "..."):
			require.True(t, strings.HasPrefix(g, strings.TrimSuffix(w, "...")), "%s: %q does not start like %q", line, g, w)
		default:
			require.Equal(t, w, g, line)
		}
	default:
		require.Equal(t, want, got, line)
	}
}
