package logging_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
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

// A command logs in the format it was told, whatever its output; told
// nothing, console for a person at a terminal and JSON lines otherwise.
func TestChooseFormat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		told     string
		terminal bool
		want     string
	}{
		{"", false, logging.JSON},
		{"", true, logging.Console},
		{logging.JSON, true, logging.JSON},
		{logging.Console, false, logging.Console},
		{logging.JSON, false, logging.JSON},
		{logging.Console, true, logging.Console},
	} {
		if got := logging.ChooseFormat(c.told, c.terminal); got != c.want {
			t.Errorf("ChooseFormat(%q, terminal %v) = %q, want %q", c.told, c.terminal, got, c.want)
		}
	}
}

// IsTerminal tells a terminal (a pseudo-terminal here) from what a
// deployed command writes to: a pipe, a file, a buffer.
func TestIsTerminal(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for name, out := range map[string]io.Writer{
		"pipe": w, "file": file, "buffer": &bytes.Buffer{},
	} {
		if logging.IsTerminal(out) {
			t.Errorf("%s: IsTerminal = true", name)
		}
		if got := logging.DefaultFormat(out); got != logging.JSON {
			t.Errorf("%s: DefaultFormat = %q, want json", name, got)
		}
	}

	// A pseudo-terminal's master side is a terminal device, as the
	// terminal a person runs a command in is its slave side.
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test the terminal case: %v", err)
	}
	defer pty.Close()
	if !logging.IsTerminal(pty) {
		t.Error("/dev/ptmx: IsTerminal = false")
	}
	if got := logging.DefaultFormat(pty); got != logging.Console {
		t.Errorf("/dev/ptmx: DefaultFormat = %q, want console", got)
	}
}

// The console format is a line for people, not JSON; the JSON format a
// JSON object per line.
func TestNewFormats(t *testing.T) {
	t.Parallel()
	var js, console bytes.Buffer
	for w, format := range map[*bytes.Buffer]string{&js: logging.JSON, &console: logging.Console} {
		log := logging.New(w, format, zerolog.InfoLevel)
		log.Info().Str("run_id", "r-1").Msg("worker started")
	}
	var line map[string]any
	if err := json.Unmarshal(js.Bytes(), &line); err != nil || line["message"] != "worker started" {
		t.Errorf("json: %q (%v)", js.String(), err)
	}
	if json.Valid(console.Bytes()) || !strings.Contains(console.String(), "worker started") || !strings.Contains(console.String(), "run_id=r-1") {
		t.Errorf("console: %q", console.String())
	}
	if strings.Contains(console.String(), "\x1b[") {
		t.Errorf("console to a buffer has colours: %q", console.String())
	}
}
