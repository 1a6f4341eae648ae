package doctest

import (
	"context"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docFiles are the markdown documents whose Go blocks and test names are
// checked: the README, CONTRIBUTING.md, docs/ and bench/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "CONTRIBUTING.md")}
	for _, pattern := range []string{"docs/*.md", "bench/*.md"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, pattern))
		require.NoError(t, err)
		files = append(files, m...)
	}
	return files
}

// goBlock is a Go block of a doc, made a package of the snippets module.
type goBlock struct {
	Block
	pkg    string // the package clause's name
	dir    string // its directory in the module
	output *Block // the ```text block shown as its output, if any
}

// TestGoBlocksBuildAndRun: every ```go block of the docs is a complete Go
// file. All of them are built in one module that requires jetflow as the
// README's `go get` line does (a replace points it at this repository);
// each `package main` is run (unless marked `<!-- doctest: build -->`, for
// a server that runs until a signal), must exit 0 within cmdTimeout, and
// must print exactly the ```text block that follows it under "Output:".
func TestGoBlocksBuildAndRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module: not in -short")
	}
	t.Parallel()
	mod := t.TempDir()
	var snippets []goBlock
	tests := map[string]bool{} // directories of test blocks
	for _, f := range docFiles(t) {
		blocks, err := Blocks(f)
		require.NoError(t, err)
		for i, b := range blocks {
			if b.Lang != "go" {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), b.Where(), b.Text, parser.PackageClauseOnly)
			require.NoError(t, err, "%s: a Go block must be a complete file with its package clause (CONTRIBUTING.md, \"Documentation is tested\")", b.Where())
			g := goBlock{Block: b, pkg: file.Name.Name, dir: fmt.Sprintf("s%d", len(snippets))}
			if i+1 < len(blocks) && blocks[i+1].Lang == "text" && blocks[i+1].Lead == "Output:" {
				g.output = &blocks[i+1]
			}
			require.Contains(t, []string{"", "build", "test"}, b.Directive, "%s: unknown directive", b.Where())
			name := "snippet.go"
			if b.Directive == "test" {
				// The test files of one package of one doc share a
				// directory, so a later block uses an earlier one's code.
				g.dir = fmt.Sprintf("t_%s_%s", strings.TrimSuffix(filepath.Base(f), ".md"), g.pkg)
				name = fmt.Sprintf("snippet%d_test.go", i)
				tests[g.dir] = true
			}
			dir := filepath.Join(mod, g.dir)
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(b.Text), 0o644))
			snippets = append(snippets, g)
		}
	}
	require.NotEmpty(t, snippets, "the README shows a Go program")

	setUpModule(t, mod)
	bin := filepath.Join(mod, "bin")
	goCmd(t, mod, "build", "-o", bin+string(filepath.Separator), "./...")

	goCmd(t, mod, "vet", "./...") // test blocks are compiled only by go test and go vet
	for dir := range tests {
		goCmd(t, mod, "test", "-count=1", "./"+dir)
	}

	ran := 0
	for _, g := range snippets {
		if g.Directive == "test" {
			require.Nil(t, g.output, "%s: a test block has no output to show", g.Where())
			continue
		}
		if g.pkg != "main" || g.Directive == "build" {
			require.Nil(t, g.output, "%s: a program that is not run has no output to show", g.Where())
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
		cmd := exec.CommandContext(ctx, filepath.Join(bin, g.dir))
		cmd.Env = cleanEnv()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		require.NoError(t, err, "%s: the program failed:\n%s%s", g.Where(), out, stderr.String())
		if g.output != nil {
			require.Equal(t, g.output.Text, string(out), "%s: the output shown at %s", g.Where(), g.output.Where())
		}
		ran++
	}
	require.NotZero(t, ran, "at least one Go program of the docs runs")
}

// setUpModule makes mod a module that requires jetflow by running the
// README's `go get` command in it, with jetflow replaced by this
// repository and no network (every dependency is in this repository's
// go.sum and the module cache).
func setUpModule(t *testing.T, mod string) {
	t.Helper()
	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	goMod := fmt.Sprintf("module doctest.example/snippets\n\ngo 1.26\n\nreplace github.com/jetflow/jetflow => %s\n", root)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte(goMod), 0o644))
	sum, err := os.ReadFile(filepath.Join(repoRoot, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.sum"), sum, 0o644))

	var get []string
	for _, b := range sectionBlocks(readmeBlocks(t), "## Using it from Go", "sh") {
		for _, c := range Commands(b) {
			if strings.HasPrefix(c.Line, "go get ") {
				get = append(get, c.Line)
			}
		}
	}
	require.Equal(t, []string{"go get github.com/jetflow/jetflow"}, get, "the README's go get line")
	f := strings.Fields(get[0])
	goCmd(t, mod, f[1:]...)
}

// goCmd runs the go command in dir, offline, and fails the test if it fails.
func goCmd(t *testing.T, dir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv("GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
}

// TestDocsNameExistingTests: every test, example and fuzz target a doc
// names in backquotes (`Test*`, `Example_*`, `Fuzz*`) is declared in a
// _test.go file of the repository, so a doc cannot cite a test that was
// renamed or never written.
func TestDocsNameExistingTests(t *testing.T) {
	t.Parallel()
	declared := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Example|Fuzz)\w*)\(`)
	require.NoError(t, filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			declared[m[1]] = true
		}
		return nil
	}))
	require.True(t, declared["TestDocsNameExistingTests"], "the walk found this file")

	named := regexp.MustCompile("`((?:Test|Example_|Fuzz)[A-Z_a-z0-9]+)`")
	count := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if m[1] == "TestMain" || m[1] == "Fuzz" {
				continue
			}
			count++
			require.True(t, declared[m[1]], "%s names %s, which no _test.go declares", f, m[1])
		}
	}
	require.Greater(t, count, 30, "docs/guarantees.md names the tests of every guarantee")
}

// TestDocsStayInsideTheRepository: the docs point only at what a reader of
// the repository can open — no path outside it — and name guarantees by
// their names in docs/guarantees.md, not by codes (G1…) or issue numbers
// kept elsewhere.
func TestDocsStayInsideTheRepository(t *testing.T) {
	t.Parallel()
	outside := regexp.MustCompile(`\.\./shared|SPEC\.md|JETSTREAM\.md`)
	code := regexp.MustCompile(`\bG[0-9]{1,2}\b|\b[Ii]ssue [0-9]+`)
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			require.False(t, outside.MatchString(line), "%s:%d points outside the repository: %s", f, i+1, line)
			require.False(t, code.MatchString(line), "%s:%d cites a code or issue a reader cannot look up: %s", f, i+1, line)
		}
	}
}
