package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/jetflow/jetflow"

// sharedTypes is the public leaf package of the types the API and the
// engine share: part of the API, imported by the engine too.
const sharedTypes = module + "/jetflowtype"

// pkg is what go list says of one package of the module.
type pkg struct {
	ImportPath   string
	Imports      []string // of its non-test code
	TestImports  []string
	XTestImports []string
	Deps         []string // of its non-test code, transitively
}

// list is go list's view of every package of the module.
func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports,Deps", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("go list: %v: %s", err, exit.Stderr)
	}
	require.NoError(t, err)
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// layer names the layer of the module's package path.
func layer(path string) string {
	rel, ok := strings.CutPrefix(path, module)
	switch {
	case !ok:
		return "outside"
	case rel == "" || rel == "/embedded" || rel == "/jetflowtype":
		return "api"
	case under(rel, "/internal/server"):
		return "server"
	case under(rel, "/internal/testsupport"), under(rel, "/jetflowtest"):
		return "testsupport"
	case under(rel, "/internal"):
		return "engine"
	case under(rel, "/cmd"), under(rel, "/workermain"):
		return "command"
	case under(rel, "/examples"):
		return "examples"
	case under(rel, "/checks"): // a module of its own: go list of this one lists none
		return "checks"
	default: // bench
		return "tools"
	}
}

func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// The engine imports nothing above it, except the shared types
// (jetflowtype), which are public but import nothing of the module.
func TestEngineImportsOnlyTheEngine(t *testing.T) {
	t.Parallel()
	for _, p := range list(t) {
		if layer(p.ImportPath) != "engine" {
			continue
		}
		for _, imp := range p.Imports {
			if imp == sharedTypes {
				continue
			}
			if l := layer(imp); l != "engine" && l != "outside" {
				t.Errorf("%s (engine) imports %s (%s)", p.ImportPath, imp, l)
			}
		}
	}
}

// The shared types are a leaf: they build the standard library only, no
// package of the module and nothing from outside it, so that every package
// can import them.
func TestSharedTypesAreALeaf(t *testing.T) {
	t.Parallel()
	for _, p := range list(t) {
		if p.ImportPath != sharedTypes {
			continue
		}
		for _, dep := range p.Deps {
			if first, _, _ := strings.Cut(dep, "/"); strings.Contains(first, ".") {
				t.Errorf("%s builds %s: it may build the standard library only", sharedTypes, dep)
			}
		}
		return
	}
	t.Fatalf("go list did not list %s", sharedTypes)
}

// Test support is imported by tests, by itself and by the benchmarks only.
func TestTestSupportOnlyInTests(t *testing.T) {
	t.Parallel()
	for _, p := range list(t) {
		if l := layer(p.ImportPath); l == "testsupport" || l == "tools" {
			continue
		}
		for _, imp := range p.Imports {
			if layer(imp) == "testsupport" {
				t.Errorf("%s (%s) imports %s outside its tests", p.ImportPath, layer(p.ImportPath), imp)
			}
		}
	}
}

// examples/ is imported by examples, the worker command that serves the
// order example, and the cluster harness that runs it; tests included.
func TestExamplesImportedByTheirUsersOnly(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{module + "/cmd/worker": true, module + "/internal/testsupport/opcluster": true}
	for _, p := range list(t) {
		if layer(p.ImportPath) == "examples" || allowed[p.ImportPath] {
			continue
		}
		for _, imp := range append(append(append([]string(nil), p.Imports...), p.TestImports...), p.XTestImports...) {
			if layer(imp) == "examples" {
				t.Errorf("%s imports %s", p.ImportPath, imp)
			}
		}
	}
}

// A program that imports the root package builds neither the embedded
// server, nor gRPC, nor the OpenTelemetry SDK and exporter, nor a product
// or test package.
func TestRootBuildsNoServerNorExporter(t *testing.T) {
	t.Parallel()
	forbidden := []string{
		"github.com/nats-io/nats-server/", "google.golang.org/grpc",
		"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters/",
		module + "/internal/natsserver", module + "/internal/server/", module + "/internal/testsupport/",
		"github.com/stretchr/testify",
	}
	for _, p := range list(t) {
		if p.ImportPath != module {
			continue
		}
		require.NotEmpty(t, p.Deps)
		for _, dep := range p.Deps {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) || dep == strings.TrimSuffix(f, "/") {
					t.Errorf("the root package builds %s", dep)
				}
			}
		}
		return
	}
	t.Fatal("go list did not list the root package")
}

// layer sorts paths as the package doc says.
func TestLayerOfAPath(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		module:                                   "api",
		module + "/embedded":                     "api",
		module + "/jetflowtype":                  "api",
		module + "/internal/runs":                "engine",
		module + "/internal/tracing/otlp":        "engine",
		module + "/internal/server/httpapi":      "server",
		module + "/internal/testsupport/testenv": "testsupport",
		module + "/jetflowtest":                  "testsupport",
		module + "/cmd/producer":                 "command",
		module + "/workermain":                   "command",
		module + "/examples/orders":              "examples",
		module + "/bench":                        "tools",
		module + "/checks/contract":              "checks",
		module + "/internalx":                    "tools",
		"github.com/nats-io/nats.go":             "outside",
	} {
		require.Equal(t, want, layer(path), path)
	}
}

// The libraries that only tests use and that would weigh on every team
// importing jetflow are required by the checks module (checks/), not by
// this one: a package of this module, or a test of one, that imported one
// would need it in go.mod.
func TestModuleRequiresNoTestOnlyHeavyweights(t *testing.T) {
	t.Parallel()
	gomod, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	for _, heavy := range []string{
		"github.com/compose-spec/", "github.com/getkin/kin-openapi", "github.com/santhosh-tekuri/jsonschema",
		"github.com/stripe/stripe-go", "k8s.io/", "github.com/chromedp/",
	} {
		require.NotContains(t, string(gomod), heavy, "go.mod requires %s: a test that needs it goes in checks/", heavy)
	}
}
