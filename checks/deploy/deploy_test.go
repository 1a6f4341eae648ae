package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The tests run in the repository's deploy/ directory (TestMain changes
// into it); the repository's root, jetflow's module root, is its parent.
const moduleRoot = ".."

// deployDir is the repository's deploy/ directory, from this package's.
const deployDir = "../../deploy"

func TestMain(m *testing.M) {
	if err := os.Chdir(deployDir); err != nil {
		fmt.Fprintln(os.Stderr, "deploy checks:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// ---------------------------------------------------------------------------
// Files parse.

func TestEveryYAMLFileParses(t *testing.T) {
	t.Parallel()
	files := filesWithExt(t, ".", ".yml", ".yaml")
	require.GreaterOrEqual(t, len(files), 12, "YAML files under deploy/: %v", files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			docs := yamlDocs(t, f)
			require.NotEmpty(t, docs, "%s has no YAML document", f)
		})
	}
}

func TestEveryJSONFileParses(t *testing.T) {
	t.Parallel()
	files := filesWithExt(t, ".", ".json")
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			var v any
			require.NoError(t, json.Unmarshal(readFile(t, f), &v), "%s", f)
		})
	}
}

// ---------------------------------------------------------------------------
// NATS configurations, read by nats-server's own parser.

// natsPasswords stand in for the environment the servers start with. They
// start with a letter: the NATS parser reads a variable's value as a config
// value, so a password of digits only would become a number.
var natsPasswords = map[string]string{
	"JETFLOW_WORKER_PASSWORD":   "w0rker-a1b2c3",
	"JETFLOW_PRODUCER_PASSWORD": "pr0ducer-d4e5f6",
	"JETFLOW_OPERATOR_PASSWORD": "operat0r-g7h8i9",
}

// natsUsers are the users of accounts.conf and the variables their
// passwords come from.
var natsUsers = map[string]string{
	"jetflow_worker":   "JETFLOW_WORKER_PASSWORD",
	"jetflow_producer": "JETFLOW_PRODUCER_PASSWORD",
	"jetflow_operator": "JETFLOW_OPERATOR_PASSWORD",
}

// operatorOnly is what the operator may publish beyond the producer: a
// task-key reset (bucket lookup, key listing through an ordered consumer,
// a purge per key) and a cancel (the run's lease and record, a child's
// parent step and the branch task that has a worker wake the parent, the
// workers' notice, the run's index entry).
// security_test.go checks these against
// a server.
var operatorOnly = []string{
	"$JS.API.STREAM.INFO.KV_jetflow_taskkeys",
	"$JS.API.DIRECT.GET.KV_jetflow_taskkeys.$KV.jetflow_taskkeys.>",
	"$JS.API.CONSUMER.CREATE.KV_jetflow_taskkeys.*.$KV.jetflow_taskkeys.>",
	"$JS.API.CONSUMER.DELETE.KV_jetflow_taskkeys.*",
	"$JS.FC.KV_jetflow_taskkeys.>",
	"$JS.FC.*.*.KV_jetflow_taskkeys.>",
	"$KV.jetflow_taskkeys.>",
	"$KV.jetflow_runs.*",
	"$KV.jetflow_steps.*.*.*",
	"$KV.jetflow_steps.*.lease",
	"jetflow.branch.*.*.*.*",
	"jetflow.cancel.*",
	"jetflow.runindex.>",
	"$JS.API.STREAM.PURGE.JETFLOW_RUN_INDEX",
}

// Not parallel: t.Setenv.
func TestNATSConfigsLoad(t *testing.T) {
	for k, v := range natsPasswords {
		t.Setenv(k, v)
	}

	t.Run("accounts.conf", func(t *testing.T) {
		opts, err := server.ProcessConfigFile("nats/accounts.conf")
		require.NoError(t, err)
		requireJetflowUsers(t, opts)
	})

	t.Run("cluster", func(t *testing.T) {
		names := map[string]bool{}
		for i := 1; i <= 3; i++ {
			name := "nats-" + strconv.Itoa(i)
			opts, err := server.ProcessConfigFile(filepath.Join("nats", "cluster", name+".conf"))
			require.NoError(t, err, name)

			require.Equal(t, name, opts.ServerName)
			require.False(t, names[opts.ServerName], "server_name %s used twice", opts.ServerName)
			names[opts.ServerName] = true
			require.True(t, opts.JetStream, "%s: JetStream off", name)
			require.Equal(t, "/data/jetstream", opts.StoreDir, name)
			require.Equal(t, 4222, opts.Port, name)
			require.Equal(t, 8222, opts.HTTPPort, "%s: monitoring port", name)
			require.Equal(t, "jetflow", opts.Cluster.Name, name)
			require.Equal(t, 6222, opts.Cluster.Port, name)
			var routes []string
			for _, r := range opts.Routes {
				routes = append(routes, r.Host)
			}
			require.ElementsMatch(t, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}, routes, name)
			requireJetflowUsers(t, opts)

			// The server accepts the options as a whole (validation only: it
			// is never started).
			s, err := server.NewServer(opts)
			require.NoError(t, err, name)
			s.Shutdown()
		}
	})

	for env := range natsPasswords {
		t.Run("missing "+env+" is refused", func(t *testing.T) {
			t.Setenv(env, natsPasswords[env]) // its cleanup restores the variable
			require.NoError(t, os.Unsetenv(env))
			_, err := server.ProcessConfigFile(filepath.Join("nats", "cluster", "nats-1.conf"))
			require.ErrorContains(t, err, env)
		})
	}
}

// TestPasswordVariables: the password variables accounts.conf reads are
// exactly those of natsPasswords (so the checks here, in Compose and in
// Kubernetes cover all of them).
func TestPasswordVariables(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	ref := regexp.MustCompile(`\$(JETFLOW_[A-Z_]+_PASSWORD)\b`)
	for _, line := range strings.Split(string(readFile(t, filepath.Join("nats", "accounts.conf"))), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // the commented-out trusted producer, the header
		}
		for _, m := range ref.FindAllStringSubmatch(line, -1) {
			read[m[1]] = true
		}
	}
	require.Equal(t, slices.Sorted(maps.Keys(natsPasswords)), slices.Sorted(maps.Keys(read)))
	require.ElementsMatch(t, slices.Collect(maps.Keys(natsPasswords)), slices.Collect(maps.Values(natsUsers)))
}

// requireJetflowUsers checks that opts carry the JETFLOW account's users
// with the passwords of the environment.
func requireJetflowUsers(t *testing.T, opts *server.Options) {
	t.Helper()
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	for user, env := range natsUsers {
		u, ok := users[user]
		require.True(t, ok, "user %s missing", user)
		require.Equal(t, natsPasswords[env], u.Password, "user %s: password from %s", user, env)
		require.NotNil(t, u.Account, "user %s has no account", user)
		require.Equal(t, "JETFLOW", u.Account.Name, "user %s", user)
		require.NotNil(t, u.Permissions, "user %s has no permissions", user)
	}

	// The operator is the producer plus task-key reset and cancel, and nothing else;
	// the producer cannot write any bucket.
	producer, operator := users["jetflow_producer"].Permissions, users["jetflow_operator"].Permissions
	require.NotNil(t, producer.Publish)
	require.NotNil(t, operator.Publish)
	require.Empty(t, producer.Publish.Deny)
	require.Empty(t, operator.Publish.Deny)
	for _, subj := range producer.Publish.Allow {
		require.False(t, strings.HasPrefix(subj, "$KV."), "the producer may write %s", subj)
		require.NotContains(t, subj, "taskkeys", "the producer may touch task keys: %s", subj)
	}
	require.ElementsMatch(t, append(slices.Clone(producer.Publish.Allow), operatorOnly...), operator.Publish.Allow,
		"jetflow_operator's publish allow list must be jetflow_producer's plus the task-key reset and cancel")
	require.Equal(t, producer.Subscribe, operator.Subscribe)
	require.Nil(t, producer.Response)
	require.Nil(t, operator.Response)
}

// ---------------------------------------------------------------------------
// Docker.

func TestDockerfile(t *testing.T) {
	t.Parallel()
	df := string(readFile(t, filepath.Join("docker", "Dockerfile")))
	for _, want := range []string{"./cmd/worker", "./cmd/producer", "CGO_ENABLED=0", "COPY go.mod go.sum"} {
		require.Contains(t, df, want)
	}
	// The runtime stage (after the last FROM) runs as a non-root user.
	runtime := df[strings.LastIndex(df, "\nFROM "):]
	user := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindStringSubmatch(runtime)
	require.NotNil(t, user, "runtime stage has no USER")
	require.NotContains(t, []string{"root", "0", "0:0"}, user[1])

	// The build context (module root) keeps what the build needs.
	ignore := string(readFile(t, filepath.Join(moduleRoot, ".dockerignore")))
	for _, line := range strings.Split(ignore, "\n") {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "internal", "examples", "embedded", "workermain", "*.go"} {
			require.NotEqual(t, needed, line, ".dockerignore excludes %s", needed)
		}
	}
}

// parseFlags reads --name=value, --name value and boolean --name.
func parseFlags(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(a, "-")
		if n, v, ok := strings.Cut(name, "="); ok {
			out[n] = v
			continue
		}
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out[name] = args[i+1]
			i++
			continue
		}
		out[name] = "true"
	}
	return out
}

// ---------------------------------------------------------------------------
// Helpers.

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// filesWithExt lists the files under dir whose names end in one of exts.
func filesWithExt(t *testing.T, dir string, exts ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && slices.Contains(exts, filepath.Ext(path)) {
			out = append(out, path)
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// yamlNodes decodes every non-empty document of a YAML file.
func yamlNodes(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, path)))
	var out []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, path)
		if len(n.Content) > 0 {
			out = append(out, &n)
		}
	}
}

// yamlDocs decodes every document of a YAML file into plain values, which
// also resolves anchors and merge keys.
func yamlDocs(t *testing.T, path string) []any {
	t.Helper()
	var out []any
	for _, n := range yamlNodes(t, path) {
		var v any
		require.NoError(t, n.Decode(&v), path)
		out = append(out, v)
	}
	return out
}

// goModVersion is the version go.mod requires of module.
func goModVersion(t *testing.T, module string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + `\s+(v\S+)`).
		FindSubmatch(readFile(t, filepath.Join(moduleRoot, "go.mod")))
	require.NotNil(t, m, "go.mod does not require %s", module)
	return string(m[1])
}

// durationOr parses s, or returns def when s is empty.
func durationOr(t *testing.T, s string, def time.Duration) time.Duration {
	t.Helper()
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}
