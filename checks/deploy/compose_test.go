package deploy

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Docker Compose, read by compose-go, the loader of `docker compose`: the
// Compose schema, interpolation (${VAR:?message}), merge keys, depends_on
// and volume consistency, and paths resolved as docker compose resolves them.

// composeEnv is the environment docker-compose.yml is loaded with: the
// NATS passwords its header says to export, and nothing else.
func composeEnv() map[string]string { return maps.Clone(natsPasswords) }

// loadComposeEnv loads docker-compose.yml with env as the environment.
func loadComposeEnv(t *testing.T, env map[string]string) (*types.Project, error) {
	t.Helper()
	return loadComposeContent(t, readFile(t, "docker-compose.yml"), env)
}

// loadComposeContent loads content as deploy/docker-compose.yml.
func loadComposeContent(t *testing.T, content []byte, env map[string]string) (*types.Project, error) {
	t.Helper()
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "docker-compose.yml"), Content: content}},
		Environment: env,
	})
}

// loadCompose is docker-compose.yml as docker compose reads it with the
// environment its header asks for.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadComposeEnv(t, composeEnv())
	require.NoError(t, err)
	return p
}

// envValue is a service's resolved environment variable ("" when unset).
func envValue(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// TestComposeLoads: the file loads; each password variable is required
// (without it the loader refuses the file and names it); and the loader
// refuses the mistakes a YAML parse would let through.
func TestComposeLoads(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	require.Equal(t, "jetflow", p.Name)
	for env := range natsPasswords {
		t.Run("without "+env, func(t *testing.T) {
			t.Parallel()
			without := composeEnv()
			delete(without, env)
			_, err := loadComposeEnv(t, without)
			require.ErrorContains(t, err, env)
		})
	}
	// The loader refuses what a YAML parse would pass.
	raw := readFile(t, "docker-compose.yml")
	for name, tc := range map[string]struct{ old, new, wantErr string }{
		"misspelt key":       {"stop_grace_period: 45s", "stop_grace_periode: 45s", "stop_grace_periode"},
		"unknown dependency": {"worker-1: { condition: service_healthy }", "worker-3: { condition: service_healthy }", "worker-3"},
		"undeclared volume":  {"- nats-1-data:/data", "- nats-4-data:/data", "nats-4-data"},
		"wrong type":         {"retries: 3\n    start_period: 30s", "retries: three\n    start_period: 30s", "retries"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, 1, strings.Count(string(raw), tc.old), tc.old)
			_, err := loadComposeContent(t, []byte(strings.Replace(string(raw), tc.old, tc.new, 1)), composeEnv())
			require.ErrorContains(t, err, tc.wantErr)
		})
	}

	// Every NATS node gets each password from the environment.
	for name, s := range p.Services {
		if strings.HasPrefix(name, "nats-") {
			for env, want := range natsPasswords {
				require.Equal(t, want, envValue(s, env), "service %s: %s", name, env)
			}
		}
	}
}

// TestComposeNATSUsers: each jetflow service logs in as its user with that
// user's password: workers as jetflow_worker, the HTTP producer as
// jetflow_operator (its API resets task keys).
func TestComposeNATSUsers(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	want := map[string]string{"worker-1": "jetflow_worker", "worker-2": "jetflow_worker", "producer": "jetflow_operator"}
	for name, user := range want {
		s := p.Services[name]
		require.Equal(t, user, envValue(s, "JETFLOW_NATS_USER"), "service %s", name)
		require.Equal(t, natsPasswords[natsUsers[user]], envValue(s, "JETFLOW_NATS_PASSWORD"),
			"service %s: the password of %s is %s", name, user, natsUsers[user])
	}
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	for _, name := range []string{"nats-1", "nats-2", "nats-3", "worker-1", "worker-2", "producer", "prometheus", "grafana"} {
		require.Contains(t, p.Services, name)
	}

	natsVersion := goModVersion(t, "github.com/nats-io/nats-server/v2")
	built := 0
	for name, s := range p.Services {
		if s.Build != nil {
			built++
			require.FileExists(t, filepath.Join(s.Build.Context, s.Build.Dockerfile), "service %s: build", name)
		}
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind {
				_, err := os.Stat(v.Source)
				require.NoError(t, err, "service %s: bind mount %s", name, v.Source)
			}
		}
		for _, port := range s.Ports {
			require.Equal(t, "127.0.0.1", port.HostIP, "service %s: port %d published beyond loopback", name, port.Target)
		}

		switch {
		case strings.HasPrefix(name, "nats-"):
			require.Equal(t, "nats:"+strings.TrimPrefix(natsVersion, "v")+"-alpine", s.Image,
				"service %s: the nats-server version of go.mod", name)
			conf := filepath.Join("nats", "cluster", name+".conf")
			require.FileExists(t, conf)
			require.Equal(t, []string{"--config", "/etc/jetflow-nats/cluster/" + name + ".conf"}, []string(s.Command), "service %s", name)
			natsDir, err := filepath.Abs("nats")
			require.NoError(t, err)
			mounted := false
			for _, v := range s.Volumes {
				mounted = mounted || (v.Type == types.VolumeTypeBind && v.Source == natsDir && v.Target == "/etc/jetflow-nats" && v.ReadOnly)
			}
			require.True(t, mounted, "service %s: deploy/nats read-only at /etc/jetflow-nats", name)

		case strings.HasPrefix(name, "worker-"):
			require.Equal(t, "worker", s.Command[0], "service %s", name)
			flags := parseFlags(s.Command[1:])
			require.Equal(t, "3", flags["replicas"], "service %s: --replicas", name)
			requireHealthcheck(t, s, flags["ops-addr"], "/readyz")
			drain := durationOr(t, envValue(s, "JETFLOW_DRAIN_TIMEOUT"), 30*time.Second)
			require.NotNil(t, s.StopGracePeriod, "service %s: stop_grace_period", name)
			require.Greater(t, time.Duration(*s.StopGracePeriod), drain,
				"service %s: stop_grace_period must outlast the drain timeout", name)

		case name == "producer":
			require.Equal(t, []string{"producer", "serve"}, []string(s.Command[:2]))
			flags := parseFlags(s.Command[2:])
			require.Equal(t, "3", flags["replicas"], "the workers' topology")
			requireHealthcheck(t, s, flags["http-addr"], "/readyz")
		}
	}
	require.GreaterOrEqual(t, built, 3, "worker-1, worker-2 and producer are built from the Dockerfile")
}

// requireHealthcheck checks that s's healthcheck asks path on the port of
// addr (a listen address, 0.0.0.0:<port>), from inside the container.
func requireHealthcheck(t *testing.T, s types.ServiceConfig, addr, path string) {
	t.Helper()
	host, port, err := splitHostPortNumber(addr)
	require.NoError(t, err, "service %s: %q", s.Name, addr)
	require.Equal(t, "0.0.0.0", host, "service %s: listen beyond the container's loopback", s.Name)
	require.NotNil(t, s.HealthCheck, "service %s: healthcheck", s.Name)
	require.Contains(t, []string(s.HealthCheck.Test), "http://127.0.0.1:"+strconv.Itoa(int(port))+path, "service %s", s.Name)
}
