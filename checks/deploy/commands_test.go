package deploy

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// ---------------------------------------------------------------------------
// The command lines Compose and Kubernetes give worker and producer, run by
// the real binaries.

// deployedCommand is one command line a deploy file runs, with the
// environment it gives it.
type deployedCommand struct {
	where string
	argv  []string // the command's name, then its arguments
	env   map[string]string
}

// deployedCommands are the command lines of the jetflow services of
// docker-compose.yml and of the containers of the applied Kubernetes
// manifests. A Secret's value stands in as "secret:<key>".
func deployedCommands(t *testing.T) []deployedCommand {
	t.Helper()
	var out []deployedCommand
	for name, s := range loadCompose(t).Services {
		if s.Build == nil {
			continue // not a jetflow image
		}
		env := map[string]string{}
		for k := range s.Environment {
			env[k] = envValue(s, k)
		}
		out = append(out, deployedCommand{where: "compose " + name, argv: s.Command, env: env})
	}

	m := appliedManifests(t)
	configMaps := map[string]*corev1.ConfigMap{}
	for _, cm := range m.configMaps {
		configMaps[cm.Name] = cm
	}
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			where := "k8s " + d.Name + "/" + c.Name
			env := map[string]string{}
			for _, ef := range c.EnvFrom {
				require.NotNil(t, ef.ConfigMapRef, "%s: envFrom other than a ConfigMap", where)
				cm, ok := configMaps[ef.ConfigMapRef.Name]
				require.True(t, ok, "%s: ConfigMap %s", where, ef.ConfigMapRef.Name)
				for k, v := range cm.Data {
					env[ef.Prefix+k] = v
				}
			}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom == nil:
					env[e.Name] = e.Value
				case e.ValueFrom.SecretKeyRef != nil:
					env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Key
				case e.ValueFrom.ConfigMapKeyRef != nil:
					cm, ok := configMaps[e.ValueFrom.ConfigMapKeyRef.Name]
					require.True(t, ok, "%s: %s: ConfigMap %s", where, e.Name, e.ValueFrom.ConfigMapKeyRef.Name)
					v, ok := cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
					require.True(t, ok, "%s: %s: ConfigMap %s has no key %s", where, e.Name, cm.Name, e.ValueFrom.ConfigMapKeyRef.Key)
					env[e.Name] = v
				default:
					t.Fatalf("%s: %s: a valueFrom this test does not know", where, e.Name)
				}
			}
			out = append(out, deployedCommand{where: where, argv: append(slices.Clone(c.Command), c.Args...), env: env})
		}
	}
	return out
}

// TestDeployedCommandsAcceptTheirSettings builds cmd/worker and
// cmd/producer and runs every command line of Compose and Kubernetes, with
// the environment the file gives it, plus --print-config: the binary must
// accept each flag (an unknown one is an error), have a setting for each
// JETFLOW_* variable and name it as that setting's source when it is not
// empty (an unknown variable would be ignored without a word).
func TestDeployedCommandsAcceptTheirSettings(t *testing.T) {
	t.Parallel()
	commands := deployedCommands(t)
	require.GreaterOrEqual(t, len(commands), 5, "3 compose services, 2 Deployments")

	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds the binaries under test")
	bin := t.TempDir()
	build := exec.Command(goTool, "build", "-o", bin+string(filepath.Separator), "./cmd/worker", "./cmd/producer")
	build.Dir = moduleRoot
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)

	// What the checks below rely on: a misspelt flag fails the command; a
	// misspelt variable names no setting, where the right one does.
	out, err = exec.Command(filepath.Join(bin, "worker"), "--ops-adr=0.0.0.0:8081", "--print-config").CombinedOutput()
	require.Error(t, err, "worker accepted --ops-adr:\n%s", out)
	out, err = exec.Command(filepath.Join(bin, "worker"), "--print-config").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, printedSources(string(out)), "ops-adr")
	require.Equal(t, "default", printedSources(string(out))["ops-addr"])

	for _, c := range commands {
		t.Run(c.where, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, []string{"worker", "producer"}, c.argv[0])
			cmd := exec.Command(filepath.Join(bin, c.argv[0]), append(slices.Clone(c.argv[1:]), "--print-config")...)
			cmd.Env = []string{}
			for k, v := range c.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s --print-config:\n%s", strings.Join(c.argv, " "), out)
			sources := printedSources(string(out))

			args := c.argv[1:]
			if c.argv[0] == "producer" {
				require.Equal(t, "serve", args[0], "the producer's deployed command is serve")
				args = args[1:]
			}
			for f := range parseFlags(args) {
				require.Equal(t, "flag", sources[f], "--%s: %s", f, out)
			}
			for k := range c.env {
				name, ok := strings.CutPrefix(k, "JETFLOW_")
				if !ok {
					continue
				}
				setting := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
				require.Contains(t, sources, setting, "%s is not a setting of %s:\n%s", k, c.argv[0], out)
				if sources[setting] != "flag" && c.env[k] != "" { // an empty variable counts as unset
					require.Equal(t, "env "+k, sources[setting], "%s:\n%s", k, out)
				}
			}
		})
	}
}

// printedSources maps each setting of --print-config's output
// ("key: value # source") to its source ("flag", "env JETFLOW_X",
// "default", ...).
func printedSources(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		key, rest, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if i := strings.LastIndex(rest, " # "); i >= 0 {
			m[key] = rest[i+len(" # "):]
		}
	}
	return m
}
