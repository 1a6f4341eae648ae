package logging_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/logging"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   time.Duration
		want string
	}{
		{193640 * time.Microsecond, "194ms"},
		{30 * time.Second, "30s"},
		{90 * time.Second, "1m30s"},
		{1500 * time.Millisecond, "1.5s"},
		{250 * time.Microsecond, "250µs"},
		{1234 * time.Nanosecond, "1µs"},
		{0, "0s"},
		{-2 * time.Millisecond, "-2ms"},
	} {
		if got := logging.Duration(c.in); got != c.want {
			t.Errorf("Duration(%d) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestDurationFieldIsAString checks the convention end to end: a duration
// field of a JSON line is a string that parses back to the duration.
func TestDurationFieldIsAString(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := logging.New(&buf, logging.JSON, zerolog.InfoLevel)
	log.Info().Str("retry_in", logging.Duration(193*time.Millisecond)).Msg("x")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not a JSON line: %q: %v", buf.String(), err)
	}
	s, ok := line["retry_in"].(string)
	if !ok {
		t.Fatalf("retry_in = %#v, want a string", line["retry_in"])
	}
	if d, err := time.ParseDuration(s); err != nil || d != 193*time.Millisecond {
		t.Fatalf("retry_in %q parses to %v, %v", s, d, err)
	}
}

// TestNoBareDurations fails on a call of zerolog's Dur anywhere in the
// module's non-test code: its number has no unit (the package's
// convention is Duration).
func TestNoBareDurations(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var found []string
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Dur" || sel.Sel.Name == "Durs") {
				found = append(found, fset.Position(sel.Pos()).String())
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s: wrong root?", checked, root)
	}
	for _, pos := range found {
		t.Errorf("%s: zerolog Dur logs a bare number; use Str(key, logging.Duration(d))", pos)
	}
}
