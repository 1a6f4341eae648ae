package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// ---------------------------------------------------------------------------
// Kubernetes: every manifest is decoded strictly into its k8s.io/api type
// (an unknown or misspelt field, a wrong type or an unknown kind is an
// error, as kubectl's server-side field validation would make it), then
// checked as objects: selectors select, probe and target ports exist,
// ServiceAccounts, ConfigMaps and Secret keys referenced exist.

// k8sScheme knows the kinds the manifests use.
var k8sScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme, autoscalingv2.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strictDecoder decodes YAML into the scheme's types, refusing unknown and
// duplicate fields.
var strictDecoder = serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory, k8sScheme, k8sScheme,
	serializerjson.SerializerOptions{Yaml: true, Strict: true})

// decodeManifests decodes every non-empty YAML document of data strictly.
func decodeManifests(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if j, err := sigsyaml.YAMLToJSON(doc); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		} else if string(j) == "null" {
			continue // comments only
		}
		obj, _, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		out = append(out, obj)
	}
}

// kustomization is the part of kustomization.yaml this directory uses,
// decoded strictly: a field kustomize has but this type lacks is refused
// too, so that an addition is checked here when it is made.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Namespace string `json:"namespace"`
	Labels    []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
		Digest  string `json:"digest"`
	} `json:"images"`
}

func loadKustomization(t *testing.T) kustomization {
	t.Helper()
	var k kustomization
	require.NoError(t, sigsyaml.UnmarshalStrict(readFile(t, filepath.Join("k8s", "kustomization.yaml")), &k))
	return k
}

// manifestSet is a set of decoded objects, by kind.
type manifestSet struct {
	deployments  []*appsv1.Deployment
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	secrets      []*corev1.Secret
	accounts     []*corev1.ServiceAccount
	budgets      []*policyv1.PodDisruptionBudget
	policies     []*networkingv1.NetworkPolicy
	autoscalers  []*autoscalingv2.HorizontalPodAutoscaler
	unrecognised []runtime.Object
}

func newManifestSet(objs []runtime.Object) manifestSet {
	var s manifestSet
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			s.deployments = append(s.deployments, o)
		case *corev1.Service:
			s.services = append(s.services, o)
		case *corev1.ConfigMap:
			s.configMaps = append(s.configMaps, o)
		case *corev1.Secret:
			s.secrets = append(s.secrets, o)
		case *corev1.ServiceAccount:
			s.accounts = append(s.accounts, o)
		case *policyv1.PodDisruptionBudget:
			s.budgets = append(s.budgets, o)
		case *networkingv1.NetworkPolicy:
			s.policies = append(s.policies, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			s.autoscalers = append(s.autoscalers, o)
		default:
			s.unrecognised = append(s.unrecognised, o)
		}
	}
	return s
}

// appliedManifests are the objects kustomization.yaml applies, each file
// decoded strictly.
func appliedManifests(t *testing.T) manifestSet {
	t.Helper()
	var objs []runtime.Object
	for _, r := range loadKustomization(t).Resources {
		o, err := decodeManifests(readFile(t, filepath.Join("k8s", r)))
		require.NoError(t, err, r)
		objs = append(objs, o...)
	}
	return newManifestSet(objs)
}

// exampleManifests decodes an example file (not applied by kustomize).
func exampleManifests(t *testing.T, name string) manifestSet {
	t.Helper()
	o, err := decodeManifests(readFile(t, filepath.Join("k8s", name)))
	require.NoError(t, err, name)
	return newManifestSet(o)
}

func (s manifestSet) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range s.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no Deployment %s", name)
	return nil
}

func (s manifestSet) service(t *testing.T, name string) *corev1.Service {
	t.Helper()
	for _, svc := range s.services {
		if svc.Name == name {
			return svc
		}
	}
	t.Fatalf("no Service %s", name)
	return nil
}

// selected are the Deployments whose pods sel selects.
func (s manifestSet) selected(sel labels.Selector) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range s.deployments {
		if !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// labelSelector converts a LabelSelector, failing t on a malformed one.
func labelSelector(t testing.TB, ls *metav1.LabelSelector, what string) labels.Selector {
	t.Helper()
	require.NotNil(t, ls, "%s: no selector", what)
	sel, err := metav1.LabelSelectorAsSelector(ls)
	require.NoError(t, err, what)
	return sel
}

// podPort finds the container port of d's pods that p names (by name or
// number); ok is false when none has it.
func podPort(d *appsv1.Deployment, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return cp, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// requireConsistent checks how the objects of s refer to one another.
func requireConsistent(t testing.TB, s manifestSet) {
	t.Helper()
	require.Empty(t, s.unrecognised)
	require.NotEmpty(t, s.deployments)
	configMaps := map[string]*corev1.ConfigMap{}
	for _, cm := range s.configMaps {
		configMaps[cm.Name] = cm
	}
	accounts := map[string]*corev1.ServiceAccount{}
	for _, sa := range s.accounts {
		accounts[sa.Name] = sa
	}
	for _, d := range s.deployments {
		pods := labels.Set(d.Spec.Template.Labels)
		require.True(t, labelSelector(t, d.Spec.Selector, d.Name).Matches(pods), "Deployment %s: its selector does not select its pods", d.Name)

		spec := d.Spec.Template.Spec
		sa, ok := accounts[spec.ServiceAccountName]
		require.True(t, ok, "Deployment %s: ServiceAccount %q is not in the manifests", d.Name, spec.ServiceAccountName)
		require.NotNil(t, sa.AutomountServiceAccountToken, "ServiceAccount %s", sa.Name)
		require.False(t, *sa.AutomountServiceAccountToken, "ServiceAccount %s: jetflow needs no API token", sa.Name)
		require.NotNil(t, spec.SecurityContext, d.Name)
		require.NotNil(t, spec.SecurityContext.RunAsNonRoot, d.Name)
		require.True(t, *spec.SecurityContext.RunAsNonRoot, "Deployment %s: runAsNonRoot", d.Name)

		for _, c := range spec.Containers {
			where := d.Name + "/" + c.Name
			require.NotNil(t, c.SecurityContext, where)
			require.Equal(t, new(false), c.SecurityContext.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation", where)
			require.Equal(t, new(true), c.SecurityContext.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", where)
			require.False(t, c.Resources.Requests.Memory().IsZero(), "%s: memory request", where)
			require.False(t, c.Resources.Limits.Memory().IsZero(), "%s: memory limit", where)
			for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				require.NotNil(t, p, "%s: no %s probe", where, name)
				require.NotNil(t, p.HTTPGet, "%s: %s probe is not httpGet", where, name)
				_, ok := podPort(d, p.HTTPGet.Port)
				require.True(t, ok, "%s: %s probe port %s is not a container port", where, name, p.HTTPGet.Port.String())
			}
			require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path, where)
			require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path, where)
			require.Equal(t, "/healthz", c.StartupProbe.HTTPGet.Path, where)
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil {
					require.Contains(t, configMaps, ef.ConfigMapRef.Name, "%s: envFrom ConfigMap", where)
				}
			}
		}

		budgets, policies := 0, 0
		for _, pdb := range s.budgets {
			if labelSelector(t, pdb.Spec.Selector, pdb.Name).Matches(pods) {
				budgets++
			}
		}
		for _, np := range s.policies {
			if labelSelector(t, &np.Spec.PodSelector, np.Name).Matches(pods) {
				policies++
			}
		}
		require.Equal(t, 1, budgets, "Deployment %s: PodDisruptionBudgets selecting its pods", d.Name)
		require.Equal(t, 1, policies, "Deployment %s: NetworkPolicies selecting its pods", d.Name)
	}

	for _, svc := range s.services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		selected := s.selected(sel)
		require.NotEmpty(t, selected, "Service %s selects no Deployment's pods", svc.Name)
		for _, d := range selected {
			for _, p := range svc.Spec.Ports {
				target := p.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(p.Port)
				}
				_, ok := podPort(d, target)
				require.True(t, ok, "Service %s: targetPort %s is not a container port of %s", svc.Name, target.String(), d.Name)
			}
			if port, ok := svc.Annotations["prometheus.io/port"]; ok {
				n, err := strconv.Atoi(port)
				require.NoError(t, err, svc.Name)
				_, ok := podPort(d, intstr.FromInt(n))
				require.True(t, ok, "Service %s: prometheus.io/port %s is not a container port of %s", svc.Name, port, d.Name)
			}
		}
	}
	for _, pdb := range s.budgets {
		require.NotEmpty(t, s.selected(labelSelector(t, pdb.Spec.Selector, pdb.Name)), "PodDisruptionBudget %s selects nothing", pdb.Name)
	}
	for _, np := range s.policies {
		selected := s.selected(labelSelector(t, &np.Spec.PodSelector, np.Name))
		require.NotEmpty(t, selected, "NetworkPolicy %s selects nothing", np.Name)
		for _, d := range selected {
			for _, rule := range np.Spec.Ingress {
				for _, p := range rule.Ports {
					require.NotNil(t, p.Port, "NetworkPolicy %s: a rule without a port opens all", np.Name)
					_, ok := podPort(d, *p.Port)
					require.True(t, ok, "NetworkPolicy %s: ingress port %s is not a container port of %s", np.Name, p.Port.String(), d.Name)
				}
			}
		}
	}
}

// TestKubernetesManifests decodes the applied manifests strictly and checks
// them as a whole, then each Deployment's settings.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	s := appliedManifests(t)
	requireConsistent(t, s)

	t.Run("worker", func(t *testing.T) {
		t.Parallel()
		d := s.deployment(t, "jetflow-worker")
		c := container(t, d, "worker")
		flags := parseFlags(c.Args)
		require.Equal(t, "3", flags["replicas"])
		requireServesOps(t, s, d, flags, "jetflow-worker-metrics")
		drain := durationOr(t, flags["drain-timeout"], 30*time.Second)
		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		require.NotNil(t, grace, "terminationGracePeriodSeconds")
		require.Greater(t, time.Duration(*grace)*time.Second, drain,
			"terminationGracePeriodSeconds must outlast --drain-timeout")
	})

	t.Run("producer", func(t *testing.T) {
		t.Parallel()
		d := s.deployment(t, "jetflow-producer")
		c := container(t, d, "producer")
		require.Equal(t, "serve", c.Args[0])
		flags := parseFlags(c.Args[1:])
		require.Equal(t, "3", flags["replicas"], "the workers' topology")
		requireServesOps(t, s, d, flags, "jetflow-producer-metrics")

		// The API's Service exposes the API port only, not /metrics.
		_, httpPort, err := splitHostPortNumber(flags["http-addr"])
		require.NoError(t, err)
		api := s.service(t, "jetflow-producer")
		require.Len(t, api.Spec.Ports, 1)
		p, ok := podPort(d, api.Spec.Ports[0].TargetPort)
		require.True(t, ok)
		require.Equal(t, httpPort, p.ContainerPort, "the API Service targets --http-addr's port")
		require.NotContains(t, api.Annotations, "prometheus.io/scrape")
	})

	t.Run("producer egress reaches NATS", func(t *testing.T) {
		t.Parallel()
		var np *networkingv1.NetworkPolicy
		for _, p := range s.policies {
			if p.Name == "jetflow-producer" {
				np = p
			}
		}
		require.NotNil(t, np)
		var cm *corev1.ConfigMap
		for _, c := range s.configMaps {
			if c.Name == "jetflow-config" {
				cm = c
			}
		}
		require.NotNil(t, cm)
		_, natsPort, err := splitHostPortNumber(strings.TrimPrefix(cm.Data["JETFLOW_NATS_URL"], "nats://"))
		require.NoError(t, err)
		found := false
		for _, rule := range np.Spec.Egress {
			for _, p := range rule.Ports {
				found = found || (p.Port != nil && p.Port.IntVal == natsPort)
			}
		}
		require.True(t, found, "NetworkPolicy jetflow-producer: no egress to the NATS port %d of JETFLOW_NATS_URL", natsPort)
	})

	t.Run("hpa example", func(t *testing.T) {
		t.Parallel()
		hpa := exampleManifests(t, "hpa.example.yaml").autoscalers
		require.Len(t, hpa, 1)
		require.Equal(t, "Deployment", hpa[0].Spec.ScaleTargetRef.Kind)
		s.deployment(t, hpa[0].Spec.ScaleTargetRef.Name)
	})

	t.Run("kustomization", func(t *testing.T) {
		t.Parallel()
		k := loadKustomization(t)
		require.Equal(t, "Kustomization", k.Kind)
		for _, r := range k.Resources {
			require.NotContains(t, r, ".example.", "examples are applied by hand")
		}
		for _, want := range []string{"worker.yaml", "producer.yaml", "config.yaml", "networkpolicy.yaml"} {
			require.Contains(t, k.Resources, want)
		}
		// Every file of k8s/ is applied, an example, or the Helm values.
		for _, f := range filesWithExt(t, "k8s", ".yaml", ".yml") {
			name := filepath.Base(f)
			require.True(t, name == "kustomization.yaml" || name == "nats-values.yaml" || strings.Contains(name, ".example.") ||
				strings.Contains(strings.Join(k.Resources, " "), name), "%s is neither applied nor an example", f)
		}
		images := map[string]bool{}
		for _, img := range k.Images {
			images[img.Name] = true
		}
		for _, d := range s.deployments {
			for _, c := range d.Spec.Template.Spec.Containers {
				require.True(t, images[c.Image], "%s/%s: image %q is not set by kustomization.yaml's images", d.Name, c.Name, c.Image)
			}
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

// requireServesOps checks that d serves /metrics, /healthz and /readyz on
// --ops-addr: its probes use that port, and the metrics Service (with its
// prometheus.io annotations) targets it.
func requireServesOps(t *testing.T, s manifestSet, d *appsv1.Deployment, flags map[string]string, metricsService string) {
	t.Helper()
	host, port, err := splitHostPortNumber(flags["ops-addr"])
	require.NoError(t, err, "%s: --ops-addr", d.Name)
	require.Equal(t, "0.0.0.0", host, "%s: --ops-addr must listen beyond the pod's loopback for the kubelet and Prometheus", d.Name)
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
			cp, ok := podPort(d, p.HTTPGet.Port)
			require.True(t, ok)
			require.Equal(t, port, cp.ContainerPort, "%s: probes go to --ops-addr's port", d.Name)
		}
	}
	svc := s.service(t, metricsService)
	require.Equal(t, "true", svc.Annotations["prometheus.io/scrape"], svc.Name)
	require.Equal(t, "/metrics", svc.Annotations["prometheus.io/path"], svc.Name)
	require.Equal(t, strconv.Itoa(int(port)), svc.Annotations["prometheus.io/port"], "%s: scraped on --ops-addr's port", svc.Name)
	require.Len(t, svc.Spec.Ports, 1)
	cp, ok := podPort(d, svc.Spec.Ports[0].TargetPort)
	require.True(t, ok)
	require.Equal(t, port, cp.ContainerPort, "%s targets --ops-addr's port", svc.Name)
}

// splitHostPortNumber splits "host:port" and parses the port.
func splitHostPortNumber(addr string) (string, int32, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q has no port", addr)
	}
	n, err := strconv.ParseInt(addr[i+1:], 10, 32)
	return addr[:i], int32(n), err
}

// container is d's container name, which runs the command of the same
// name.
func container(t *testing.T, d *appsv1.Deployment, name string) corev1.Container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			require.Equal(t, []string{name}, c.Command, "%s: the image has both commands; name one", d.Name)
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %s", d.Name, name)
	return corev1.Container{}
}

// The strict decoding refuses what a lenient parse would pass: a misspelt
// field, a wrong type, an unknown kind; and the consistency checks refuse a
// selector that selects nothing and a probe on a port the pod lacks.
func TestKubernetesChecksRefuseMistakes(t *testing.T) {
	t.Parallel()
	worker := readFile(t, filepath.Join("k8s", "worker.yaml"))
	for name, tc := range map[string]struct{ old, new, wantErr string }{
		"misspelt field": {"readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		"wrong type":     {"replicas: 2", `replicas: "two"`, "replicas"},
		"unknown kind":   {"kind: PodDisruptionBudget", "kind: PodDisruptionBudgt", "PodDisruptionBudgt"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, 1, bytes.Count(worker, []byte(tc.old)), tc.old)
			_, err := decodeManifests(bytes.Replace(worker, []byte(tc.old), []byte(tc.new), 1))
			require.ErrorContains(t, err, tc.wantErr)
		})
	}

	// A manifest set with a broken reference fails requireConsistent.
	for name, edit := range map[string]func(s manifestSet){
		"service selects nothing": func(s manifestSet) {
			s.services[0].Spec.Selector = map[string]string{"app.kubernetes.io/name": "nobody"}
		},
		"probe port missing": func(s manifestSet) {
			s.deployments[0].Spec.Template.Spec.Containers[0].StartupProbe.HTTPGet.Port = intstr.FromString("opz")
		},
		"no NetworkPolicy": func(s manifestSet) {
			s.policies[0].Spec.PodSelector.MatchLabels = map[string]string{"app.kubernetes.io/name": "nobody"}
		},
		"service account missing": func(s manifestSet) {
			s.deployments[0].Spec.Template.Spec.ServiceAccountName = "default"
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := appliedManifests(t)
			edit(s)
			rec := &failRecorder{TB: t}
			rec.run(func() { requireConsistent(rec, s) })
			require.NotEmpty(t, rec.failures(), "requireConsistent passed a broken manifest set")
		})
	}
}

// TestKustomizeRender renders the kustomization with kubectl (skipped
// without it, as kubectl apply -k would render it) and checks the rendered
// objects as the files: the namespace and label of kustomization.yaml on
// every object, the image set, and the same consistency.
func TestKustomizeRender(t *testing.T) {
	t.Parallel()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH: the kustomize rendering is checked where it is installed")
	}
	out, err := exec.Command(kubectl, "kustomize", "k8s").Output()
	require.NoError(t, err, "kubectl kustomize k8s: %s", stderrOf(err))
	objs, err := decodeManifests(out)
	require.NoError(t, err)
	s := newManifestSet(objs)
	requireConsistent(t, s)

	k := loadKustomization(t)
	applied := appliedManifests(t)
	require.Len(t, objs, len(applied.deployments)+len(applied.services)+len(applied.configMaps)+len(applied.secrets)+
		len(applied.accounts)+len(applied.budgets)+len(applied.policies)+len(applied.autoscalers))
	for _, o := range objs {
		m, err := meta(o)
		require.NoError(t, err)
		require.Equal(t, k.Namespace, m.GetNamespace(), "%T %s", o, m.GetName())
		for _, l := range k.Labels {
			for key, v := range l.Pairs {
				require.Equal(t, v, m.GetLabels()[key], "%T %s: label %s", o, m.GetName(), key)
			}
		}
	}
	for _, d := range s.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			require.Equal(t, k.Images[0].Name+":"+k.Images[0].NewTag, c.Image, "%s: the image of kustomization.yaml", d.Name)
		}
	}
}

// meta is o's object metadata.
func meta(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

// stderrOf is the standard error of a failed command, if err has it.
func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// TestKubernetesNATSUsers: each Deployment logs in as its user with the
// Secret key the NATS servers read that user's password from (workers as
// jetflow_worker, the HTTP producer as jetflow_operator: its API resets task
// keys), and the Secret example has every key anything reads.
func TestKubernetesNATSUsers(t *testing.T) {
	t.Parallel()
	const secretName = "jetflow-nats-credentials"
	secrets := exampleManifests(t, "secret.example.yaml").secrets
	require.Len(t, secrets, 1)
	secret := secrets[0]
	require.Equal(t, secretName, secret.Name)

	// The servers: password variable -> Secret key, from the Helm values'
	// env entries decoded strictly as EnvVarSources.
	var values struct {
		Container struct {
			Env map[string]any `yaml:"env"`
		} `yaml:"container"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("k8s", "nats-values.yaml")), &values))
	serverKey := map[string]string{}
	for env := range natsPasswords {
		raw, err := sigsyaml.Marshal(values.Container.Env[env])
		require.NoError(t, err)
		var src struct {
			ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
		}
		require.NoError(t, sigsyaml.UnmarshalStrict(raw, &src), "nats-values.yaml: %s", env)
		require.NotNil(t, src.ValueFrom, "nats-values.yaml: %s", env)
		ref := src.ValueFrom.SecretKeyRef
		require.NotNil(t, ref, "nats-values.yaml: %s from a Secret", env)
		require.Equal(t, secretName, ref.Name, "nats-values.yaml: %s", env)
		require.Contains(t, secret.StringData, ref.Key, "secret.example.yaml: the key of %s", env)
		serverKey[env] = ref.Key
	}

	s := appliedManifests(t)
	for name, want := range map[string]string{"jetflow-worker": "jetflow_worker", "jetflow-producer": "jetflow_operator"} {
		c := container(t, s.deployment(t, name), strings.TrimPrefix(name, "jetflow-"))
		user, key := "", ""
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				require.Equal(t, secretName, e.ValueFrom.SecretKeyRef.Name, "%s: %s", name, e.Name)
				require.Contains(t, secret.StringData, e.ValueFrom.SecretKeyRef.Key, "%s: %s: secret.example.yaml has no such key", name, e.Name)
			}
			switch e.Name {
			case "JETFLOW_NATS_USER":
				user = e.Value
			case "JETFLOW_NATS_PASSWORD":
				require.NotNil(t, e.ValueFrom, "%s: password from a Secret", name)
				require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: password from a Secret", name)
				key = e.ValueFrom.SecretKeyRef.Key
			}
		}
		require.Equal(t, want, user, "%s: JETFLOW_NATS_USER", name)
		require.Equal(t, serverKey[natsUsers[user]], key,
			"%s: the password of %s is the Secret key the servers read %s from", name, user, natsUsers[user])
	}
}

// failRecorder is a testing.TB whose failures are recorded instead of
// reported, for tests of the checks themselves.
type failRecorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *failRecorder) Helper() {}

func (r *failRecorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *failRecorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	goruntime.Goexit()
}

func (r *failRecorder) FailNow() {
	r.Errorf("FailNow")
	goruntime.Goexit()
}

// run runs f on a goroutine of its own, which FailNow and Fatalf end.
func (r *failRecorder) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func (r *failRecorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}
