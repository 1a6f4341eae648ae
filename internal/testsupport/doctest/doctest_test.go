package doctest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeDoc writes text to a markdown file of the test's and returns its path.
func writeDoc(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "doc.md")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// TestBlocks: fences at any indentation (a list item's block loses the
// fence's indentation), the directive on the line above, the section and the
// line of prose above, and inline code that only looks like a fence.
func TestBlocks(t *testing.T) {
	t.Parallel()
	path := writeDoc(t, "# title\n\n## Section\n\nOutput:\n\n<!-- doctest: build -->\n```go\npackage main\n```\n\n"+
		"- item\n\n  ```sh\n  echo hi   # hi\n  ```\n\n  ```` ```text ```` is inline code\n")
	blocks, err := Blocks(path)
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	require.Equal(t, Block{File: path, Line: 8, Lang: "go", Directive: "build", Section: "## Section", Lead: "Output:", Text: "package main\n"}, blocks[0])
	require.Equal(t, "sh", blocks[1].Lang)
	require.Equal(t, "", blocks[1].Directive)
	require.Equal(t, "- item", blocks[1].Lead)
	require.Equal(t, "echo hi   # hi\n", blocks[1].Text)

	_, err = Blocks(writeDoc(t, "```sh\necho never closed\n"))
	require.ErrorContains(t, err, ":1: code block never closed")
}

// TestCommandsAndCheckOutput: a comment after " # " is split at "…" into
// fragments that must appear in order, white space compared loosely.
func TestCommandsAndCheckOutput(t *testing.T) {
	t.Parallel()
	cmds := Commands(Block{Text: "X=1\n\nprog get a   # run: a … status: completed … a.b.0 2 …\n"})
	require.Equal(t, []Command{
		{Line: "X=1"},
		{Line: "prog get a", Want: []string{"run: a", "status: completed", "a.b.0 2"}},
	}, cmds)

	out := "run:    a\nstatus:\tcompleted\r\nsteps:\n  a.b.0      2   ok\n"
	require.NoError(t, CheckOutput(out, cmds[1].Want))
	require.ErrorContains(t, CheckOutput(out, []string{"status: completed", "run: a"}), `lacks "run: a"`, "order matters")
	require.ErrorContains(t, CheckOutput(out, []string{"status: failed"}), `lacks "status: failed"`)
}
