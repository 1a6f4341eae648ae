package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
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

// The test runs in deploy/; the module root is its parent.
const moduleRoot = ".."

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
// a purge per key). security_test.go checks these against a server.
var operatorOnly = []string{
	"$JS.API.STREAM.INFO.KV_jetflow_taskkeys",
	"$JS.API.CONSUMER.CREATE.KV_jetflow_taskkeys.*.$KV.jetflow_taskkeys.>",
	"$JS.API.CONSUMER.DELETE.KV_jetflow_taskkeys.*",
	"$JS.FC.KV_jetflow_taskkeys.>",
	"$JS.FC.*.*.KV_jetflow_taskkeys.>",
	"$KV.jetflow_taskkeys.>",
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
// exactly those of natsPasswords (so the checks here and in Kubernetes
// cover all of them), and every NATS node of Compose gets each one.
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

	for name, s := range loadCompose(t).Services {
		if strings.HasPrefix(name, "nats-") {
			for env := range natsPasswords {
				require.True(t, strings.HasPrefix(s.Environment[env], "${"+env+":?"),
					"service %s: %s from the environment, required; got %q", name, env, s.Environment[env])
			}
		}
	}
}

// TestComposeNATSUsers: each jetflow service logs in as its user with that
// user's password: workers as jetflow_worker, the HTTP producer as
// jetflow_operator (its API resets task keys).
func TestComposeNATSUsers(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	want := map[string]string{"worker-1": "jetflow_worker", "worker-2": "jetflow_worker", "producer": "jetflow_operator"}
	for name, user := range want {
		env := c.Services[name].Environment
		require.Equal(t, user, env["JETFLOW_NATS_USER"], "service %s", name)
		require.True(t, strings.HasPrefix(env["JETFLOW_NATS_PASSWORD"], "${"+natsUsers[user]+":?"),
			"service %s: the password of %s is %s, got %q", name, user, natsUsers[user], env["JETFLOW_NATS_PASSWORD"])
	}
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

	// The operator is the producer plus task-key reset, and nothing else;
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
		"jetflow_operator's publish allow list must be jetflow_producer's plus the task-key reset")
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

// ---------------------------------------------------------------------------
// Docker Compose.

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Build           any               `yaml:"build"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	Healthcheck     *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	require.NoError(t, yaml.Unmarshal(readFile(t, "docker-compose.yml"), &c))
	return c
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for _, name := range []string{"nats-1", "nats-2", "nats-3", "worker-1", "worker-2", "producer", "prometheus", "grafana"} {
		require.Contains(t, c.Services, name)
	}

	natsVersion := goModVersion(t, "github.com/nats-io/nats-server/v2")
	built := 0
	for name, s := range c.Services {
		if s.Build != nil {
			built++
			dockerfile := composeDockerfile(t, s.Build)
			require.FileExists(t, dockerfile, "service %s: build", name)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				_, err := os.Stat(src)
				require.NoError(t, err, "service %s: volume %s", name, v)
			}
		}

		switch {
		case strings.HasPrefix(name, "nats-"):
			require.Equal(t, "nats:"+strings.TrimPrefix(natsVersion, "v")+"-alpine", s.Image,
				"service %s: the nats-server version of go.mod", name)
			conf := filepath.Join("nats", "cluster", name+".conf")
			require.FileExists(t, conf)
			require.Contains(t, strings.Join(s.Command, " "), "/cluster/"+name+".conf", "service %s", name)
			require.Contains(t, s.Volumes, "./nats:/etc/jetflow-nats:ro", "service %s", name)

		case strings.HasPrefix(name, "worker-"):
			require.Equal(t, "worker", s.Command[0], "service %s", name)
			flags := parseFlags(s.Command[1:])
			require.Equal(t, "3", flags["replicas"], "service %s: --replicas", name)
			require.Equal(t, "0.0.0.0:8081", flags["ops-addr"], "service %s: --ops-addr", name)
			require.NotNil(t, s.Healthcheck, "service %s", name)
			require.Contains(t, strings.Join(s.Healthcheck.Test, " "), "127.0.0.1:8081/readyz", "service %s", name)
			drain := durationOr(t, s.Environment["JETFLOW_DRAIN_TIMEOUT"], 30*time.Second)
			require.Greater(t, durationOr(t, s.StopGracePeriod, 10*time.Second), drain,
				"service %s: stop_grace_period must outlast the drain timeout", name)

		case name == "producer":
			require.Equal(t, []string{"producer", "serve"}, s.Command[:2])
			flags := parseFlags(s.Command[2:])
			require.Equal(t, "0.0.0.0:8080", flags["http-addr"])
			require.Equal(t, "3", flags["replicas"], "the workers' topology")
			require.NotNil(t, s.Healthcheck)
			require.Contains(t, strings.Join(s.Healthcheck.Test, " "), "127.0.0.1:8080/readyz")
		}
	}
	require.GreaterOrEqual(t, built, 3, "worker-1, worker-2 and producer are built from the Dockerfile")
}

// composeDockerfile is the Dockerfile a compose build: points at. Paths are
// relative to the compose file, which is in deploy/.
func composeDockerfile(t *testing.T, build any) string {
	t.Helper()
	switch b := build.(type) {
	case string:
		return filepath.Join(b, "Dockerfile")
	case map[string]any:
		ctx, _ := b["context"].(string)
		if ctx == "" {
			ctx = "."
		}
		df, _ := b["dockerfile"].(string)
		if df == "" {
			df = "Dockerfile"
		}
		return filepath.Join(ctx, df)
	}
	t.Fatalf("build: unexpected %T", build)
	return ""
}

// ---------------------------------------------------------------------------
// Flags used by Compose and Kubernetes exist in the commands.

// TestDeployedFlagsExist checks every flag and JETFLOW_* variable given to
// worker and producer in Compose and Kubernetes against the commands'
// sources: the flag's name must be a string literal in cmd/<command>/*.go
// (not tests). A simple scan, not a parse: it catches typos and flags that
// were renamed or never added.
func TestDeployedFlagsExist(t *testing.T) {
	t.Parallel()
	used := map[string]map[string]string{"worker": {}, "producer": {}} // command -> flag -> where
	add := func(cmd, flag, where string) {
		require.Contains(t, used, cmd, "%s: unknown command %q", where, cmd)
		used[cmd][flag] = where
	}
	addEnv := func(cmd, env, where string) {
		if name, ok := strings.CutPrefix(env, "JETFLOW_"); ok {
			add(cmd, strings.ToLower(strings.ReplaceAll(name, "_", "-")), where+" "+env)
		}
	}

	for name, s := range loadCompose(t).Services {
		if s.Build == nil || len(s.Command) == 0 {
			continue
		}
		cmd, args := s.Command[0], s.Command[1:]
		if cmd == "producer" && len(args) > 0 && args[0] == "serve" {
			args = args[1:]
		}
		for f := range parseFlags(args) {
			add(cmd, f, "compose "+name)
		}
		for env := range s.Environment {
			addEnv(cmd, env, "compose "+name)
		}
	}

	objs := k8sObjects(t)
	configMaps := map[string][]string{}
	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			var cm struct {
				Data map[string]string `yaml:"data"`
			}
			require.NoError(t, o.node.Decode(&cm))
			for k := range cm.Data {
				configMaps[o.Metadata.Name] = append(configMaps[o.Metadata.Name], k)
			}
		}
	}
	for _, name := range []string{"jetflow-worker", "jetflow-producer"} {
		cmd := strings.TrimPrefix(name, "jetflow-")
		_, c := deploymentContainer(t, objs, name, cmd)
		args := c.Args
		if cmd == "producer" && len(args) > 0 && args[0] == "serve" {
			args = args[1:]
		}
		for f := range parseFlags(args) {
			add(cmd, f, "k8s "+name)
		}
		for _, e := range c.Env {
			addEnv(cmd, e.Name, "k8s "+name)
		}
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil {
				keys, ok := configMaps[ef.ConfigMapRef.Name]
				require.True(t, ok, "k8s %s: ConfigMap %s", name, ef.ConfigMapRef.Name)
				for _, k := range keys {
					addEnv(cmd, k, "k8s "+name+" ConfigMap "+ef.ConfigMapRef.Name)
				}
			}
		}
	}

	for cmd, flags := range used {
		literals := sourceLiterals(t, filepath.Join(moduleRoot, "cmd", cmd))
		if cmd == "producer" {
			require.True(t, literals["serve"], "cmd/producer has no serve command")
		}
		for f, where := range flags {
			require.True(t, literals[f], "%s: --%s is not a flag of cmd/%s", where, f, cmd)
		}
	}
}

// sourceLiterals are the string literals that look like flag names in the
// non-test Go files of dir and of the module's internal packages they
// import (the --nats-* flags are defined in internal/natsconn); a command
// package they import (workermain, whose flags cmd/worker has) counts as
// part of dir.
func sourceLiterals(t *testing.T, dir string) map[string]bool {
	t.Helper()
	const internalPrefix = "github.com/jetflow/jetflow/internal/"
	commandPkgs := map[string]string{"github.com/jetflow/jetflow/workermain": "workermain"}
	lit := regexp.MustCompile(`"([a-z][a-z0-9]*(?:-[a-z0-9]+)*)"`)
	out := map[string]bool{}
	dirs, seen := []string{dir}, map[string]bool{dir: true}
	command := map[string]bool{dir: true}
	for len(dirs) > 0 {
		d := dirs[0]
		dirs = dirs[1:]
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			path := filepath.Join(d, e.Name())
			src := readFile(t, path)
			for _, m := range lit.FindAllSubmatch(src, -1) {
				out[string(m[1])] = true
			}
			if !command[d] {
				continue // one level of imports
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range f.Imports {
				if pkg, ok := commandPkgs[strings.Trim(imp.Path.Value, `"`)]; ok {
					cdir := filepath.Join(moduleRoot, pkg)
					if !seen[cdir] {
						seen[cdir], command[cdir] = true, true
						dirs = append(dirs, cdir)
					}
				}
				if pkg, ok := strings.CutPrefix(strings.Trim(imp.Path.Value, `"`), internalPrefix); ok {
					idir := filepath.Join(moduleRoot, "internal", filepath.FromSlash(pkg))
					if !seen[idir] {
						seen[idir] = true
						dirs = append(dirs, idir)
					}
				}
			}
		}
	}
	return out
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
