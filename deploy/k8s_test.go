package deploy

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// ---------------------------------------------------------------------------
// Kubernetes.

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	file string
	node *yaml.Node
}

type k8sDeployment struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               map[string]any `yaml:"securityContext"`
				Containers                    []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string        `yaml:"name"`
		Value     string        `yaml:"value"`
		ValueFrom *k8sValueFrom `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext map[string]any `yaml:"securityContext"`
}

type k8sValueFrom struct {
	SecretKeyRef *struct {
		Name string `yaml:"name"`
		Key  string `yaml:"key"`
	} `yaml:"secretKeyRef"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// k8sObjects are the Kubernetes objects under k8s/, all files but the Helm
// values.
func k8sObjects(t *testing.T) []k8sObject {
	t.Helper()
	var out []k8sObject
	for _, f := range filesWithExt(t, "k8s", ".yaml", ".yml") {
		if filepath.Base(f) == "nats-values.yaml" {
			continue
		}
		for _, n := range yamlNodes(t, f) {
			var o k8sObject
			require.NoError(t, n.Decode(&o), f)
			o.file, o.node = f, n
			out = append(out, o)
		}
	}
	return out
}

func findObject(t *testing.T, objs []k8sObject, kind, name string) k8sObject {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s under k8s/", kind, name)
	return k8sObject{}
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	objs := k8sObjects(t)
	require.GreaterOrEqual(t, len(objs), 9)
	for _, o := range objs {
		require.NotEmpty(t, o.APIVersion, "%s: an object without apiVersion", o.file)
		require.NotEmpty(t, o.Kind, "%s: an object without kind", o.file)
		require.NotEmpty(t, o.Metadata.Name, "%s: a %s without metadata.name", o.file, o.Kind)
	}

	t.Run("worker", func(t *testing.T) {
		t.Parallel()
		d, c := deploymentContainer(t, objs, "jetflow-worker", "worker")
		requireProbes(t, c)
		flags := parseFlags(c.Args)
		require.Equal(t, "3", flags["replicas"])
		require.Equal(t, "0.0.0.0:8081", flags["ops-addr"])
		drain := durationOr(t, flags["drain-timeout"], 30*time.Second)
		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		require.NotNil(t, grace, "terminationGracePeriodSeconds")
		require.Greater(t, time.Duration(*grace)*time.Second, drain,
			"terminationGracePeriodSeconds must outlast --drain-timeout")
		requireNonRoot(t, d, c)
		require.NotEmpty(t, c.Resources.Requests, "resources.requests")
		require.NotEmpty(t, c.Resources.Limits, "resources.limits")

		pdb := findObject(t, objs, "PodDisruptionBudget", "jetflow-worker")
		requireSelects(t, pdb, d)
		svc := findObject(t, objs, "Service", "jetflow-worker-metrics")
		requireSelects(t, svc, d)
	})

	t.Run("producer", func(t *testing.T) {
		t.Parallel()
		d, c := deploymentContainer(t, objs, "jetflow-producer", "producer")
		requireProbes(t, c)
		require.Equal(t, "serve", c.Args[0])
		flags := parseFlags(c.Args[1:])
		require.Equal(t, "0.0.0.0:8080", flags["http-addr"])
		require.Equal(t, "3", flags["replicas"], "the workers' topology")
		requireNonRoot(t, d, c)
		requireSelects(t, findObject(t, objs, "Service", "jetflow-producer"), d)
	})

	t.Run("hpa example", func(t *testing.T) {
		t.Parallel()
		var hpa struct {
			Spec struct {
				ScaleTargetRef struct {
					Kind string `yaml:"kind"`
					Name string `yaml:"name"`
				} `yaml:"scaleTargetRef"`
			} `yaml:"spec"`
		}
		o := findObject(t, objs, "HorizontalPodAutoscaler", "jetflow-worker")
		require.NoError(t, o.node.Decode(&hpa))
		require.Equal(t, "Deployment", hpa.Spec.ScaleTargetRef.Kind)
		require.Equal(t, "jetflow-worker", hpa.Spec.ScaleTargetRef.Name)
	})

	t.Run("kustomization", func(t *testing.T) {
		t.Parallel()
		var k struct {
			Resources []string `yaml:"resources"`
		}
		require.NoError(t, findObject(t, objs, "Kustomization", "jetflow").node.Decode(&k))
		require.NotEmpty(t, k.Resources)
		for _, r := range k.Resources {
			require.FileExists(t, filepath.Join("k8s", r))
			require.NotContains(t, r, ".example.", "examples are applied by hand")
		}
		for _, want := range []string{"worker.yaml", "producer.yaml", "config.yaml"} {
			require.Contains(t, k.Resources, want)
		}
	})

	t.Run("helm values", func(t *testing.T) {
		t.Parallel()
		var v struct {
			Config struct {
				Cluster struct {
					Enabled  bool `yaml:"enabled"`
					Replicas int  `yaml:"replicas"`
				} `yaml:"cluster"`
				JetStream struct {
					Enabled   bool `yaml:"enabled"`
					FileStore struct {
						Enabled bool `yaml:"enabled"`
						PVC     struct {
							Enabled bool `yaml:"enabled"`
						} `yaml:"pvc"`
					} `yaml:"fileStore"`
				} `yaml:"jetstream"`
				Merge map[string]string `yaml:"merge"`
			} `yaml:"config"`
			Container struct {
				Image struct {
					Tag string `yaml:"tag"`
				} `yaml:"image"`
				Env map[string]any `yaml:"env"`
			} `yaml:"container"`
		}
		require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("k8s", "nats-values.yaml")), &v))
		require.True(t, v.Config.Cluster.Enabled)
		require.Equal(t, 3, v.Config.Cluster.Replicas)
		require.True(t, v.Config.JetStream.Enabled)
		require.True(t, v.Config.JetStream.FileStore.Enabled)
		require.True(t, v.Config.JetStream.FileStore.PVC.Enabled)
		require.Equal(t, "./accounts.conf", v.Config.Merge["$include"])
		require.Equal(t, strings.TrimPrefix(goModVersion(t, "github.com/nats-io/nats-server/v2"), "v")+"-alpine", v.Container.Image.Tag)
		for env := range natsPasswords {
			require.Contains(t, v.Container.Env, env, "accounts.conf reads it")
		}
	})
}

// TestKubernetesNATSUsers: each Deployment logs in as its user with the
// Secret key the NATS servers read that user's password from (workers as
// jetflow_worker, the HTTP producer as jetflow_operator: its API resets task
// keys), and the Secret example has every key anything reads.
func TestKubernetesNATSUsers(t *testing.T) {
	t.Parallel()
	const secretName = "jetflow-nats-credentials"
	objs := k8sObjects(t)

	var secret struct {
		StringData map[string]string `yaml:"stringData"`
	}
	require.NoError(t, findObject(t, objs, "Secret", secretName).node.Decode(&secret))

	// The servers: password variable -> Secret key.
	var values struct {
		Container struct {
			Env map[string]k8sEnvSource `yaml:"env"`
		} `yaml:"container"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("k8s", "nats-values.yaml")), &values))
	serverKey := map[string]string{}
	for env := range natsPasswords {
		ref := values.Container.Env[env].ValueFrom
		require.NotNil(t, ref, "nats-values.yaml: %s", env)
		require.NotNil(t, ref.SecretKeyRef, "nats-values.yaml: %s from a Secret", env)
		require.Equal(t, secretName, ref.SecretKeyRef.Name, "nats-values.yaml: %s", env)
		require.Contains(t, secret.StringData, ref.SecretKeyRef.Key, "secret.example.yaml: the key of %s", env)
		serverKey[env] = ref.SecretKeyRef.Key
	}

	for name, want := range map[string]string{"jetflow-worker": "jetflow_worker", "jetflow-producer": "jetflow_operator"} {
		_, c := deploymentContainer(t, objs, name, strings.TrimPrefix(name, "jetflow-"))
		user, key := "", ""
		for _, e := range c.Env {
			switch e.Name {
			case "JETFLOW_NATS_USER":
				user = e.Value
			case "JETFLOW_NATS_PASSWORD":
				require.NotNil(t, e.ValueFrom, "%s: password from a Secret", name)
				require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: password from a Secret", name)
				require.Equal(t, secretName, e.ValueFrom.SecretKeyRef.Name, name)
				key = e.ValueFrom.SecretKeyRef.Key
			}
		}
		require.Equal(t, want, user, "%s: JETFLOW_NATS_USER", name)
		require.Equal(t, serverKey[natsUsers[user]], key,
			"%s: the password of %s is the Secret key the servers read %s from", name, user, natsUsers[user])
	}
}

// k8sEnvSource is a Helm values env entry: name -> {valueFrom: ...}.
type k8sEnvSource struct {
	ValueFrom *k8sValueFrom `yaml:"valueFrom"`
}

func deploymentContainer(t *testing.T, objs []k8sObject, name, container string) (k8sDeployment, k8sContainer) {
	t.Helper()
	var d k8sDeployment
	require.NoError(t, findObject(t, objs, "Deployment", name).node.Decode(&d))
	require.NotEmpty(t, d.Spec.Selector.MatchLabels)
	for k, v := range d.Spec.Selector.MatchLabels {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "%s: the selector matches the pods", name)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == container {
			require.Equal(t, []string{container}, c.Command, "%s: the image has both commands; name one", name)
			return d, c
		}
	}
	t.Fatalf("deployment %s has no container %s", name, container)
	return d, k8sContainer{}
}

func requireProbes(t *testing.T, c k8sContainer) {
	t.Helper()
	for path, p := range map[string]*k8sProbe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		require.NotNil(t, p, "%s: no probe for %s", c.Name, path)
		require.NotNil(t, p.HTTPGet, "%s: %s probe is not httpGet", c.Name, path)
		require.Equal(t, path, p.HTTPGet.Path, c.Name)
		found := false
		for _, port := range c.Ports {
			found = found || p.HTTPGet.Port == port.Name || p.HTTPGet.Port == port.ContainerPort
		}
		require.True(t, found, "%s: probe port %v is not a container port", c.Name, p.HTTPGet.Port)
	}
}

func requireNonRoot(t *testing.T, d k8sDeployment, c k8sContainer) {
	t.Helper()
	pod, ctr := d.Spec.Template.Spec.SecurityContext, c.SecurityContext
	require.True(t, pod["runAsNonRoot"] == true || ctr["runAsNonRoot"] == true, "%s: runAsNonRoot", c.Name)
	require.Equal(t, false, ctr["allowPrivilegeEscalation"], "%s", c.Name)
}

// requireSelects checks that o (a Service or PodDisruptionBudget) selects
// the pods of d.
func requireSelects(t *testing.T, o k8sObject, d k8sDeployment) {
	t.Helper()
	var sel struct {
		Spec struct {
			Selector map[string]any `yaml:"selector"`
		} `yaml:"spec"`
	}
	require.NoError(t, o.node.Decode(&sel))
	labels := sel.Spec.Selector
	if m, ok := labels["matchLabels"].(map[string]any); ok {
		labels = m
	}
	require.NotEmpty(t, labels, "%s %s selects nothing", o.Kind, o.Metadata.Name)
	for k, v := range labels {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "%s %s: selector %s", o.Kind, o.Metadata.Name, k)
	}
}
