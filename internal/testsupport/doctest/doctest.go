// Package doctest reads what the project's markdown documents show — fenced
// code blocks, the shell commands in them and the output their comments
// promise — so that tests can build, run and check it. The conventions it
// reads are described in CONTRIBUTING.md ("Documentation is tested").
package doctest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Block is one fenced code block of a markdown document.
type Block struct {
	// File is the document's path, as given to Blocks.
	File string
	// Line is the 1-based line of the opening fence.
	Line int
	// Lang is the fence's info string ("go", "sh", "text", or "").
	Lang string
	// Directive is the X of a `<!-- doctest: X -->` comment on the line
	// right above the fence, or "".
	Directive string
	// Section is the nearest heading above the block ("## A short tour"),
	// or "".
	Section string
	// Lead is the last non-blank line of prose above the block ("Output:").
	Lead string
	// Text is the block's content, without the fences and without the
	// indentation of the opening fence.
	Text string
}

// Where names the block for messages: file:line.
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

var directiveRE = regexp.MustCompile(`^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$`)

// Blocks returns the fenced code blocks of the markdown file at path, in
// order. A fence is a line of three or more backquotes, indented or not (a
// block inside a list item); an unterminated block is an error.
func Blocks(path string) ([]Block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks              []Block
		cur                 *Block
		indent              string
		body                strings.Builder
		prev, lead, section string
		n                   int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && !strings.Contains(strings.TrimLeft(trimmed, "`"), "`"):
			// An opening fence's info string has no backquote (CommonMark):
			// "```` ```go ````" is inline code, not a fence.
			cur = &Block{File: path, Line: n, Lang: strings.TrimSpace(strings.TrimLeft(trimmed, "`")),
				Section: section, Lead: lead}
			if m := directiveRE.FindStringSubmatch(prev); m != nil {
				cur.Directive = m[1]
			}
			indent = line[:len(line)-len(trimmed)]
			body.Reset()
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			cur.Text = body.String()
			blocks = append(blocks, *cur)
			cur, lead = nil, ""
		case cur != nil:
			body.WriteString(strings.TrimPrefix(line, indent))
			body.WriteByte('\n')
		case strings.HasPrefix(line, "#"):
			section, lead = line, ""
		case strings.TrimSpace(line) != "" && !directiveRE.MatchString(line):
			lead = strings.TrimSpace(line)
		}
		prev = line
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: code block never closed", path, cur.Line)
	}
	return blocks, nil
}

// Command is one line of a shell block: the command, and the fragments of
// its output that its comment promises.
type Command struct {
	// Line is the command as a shell runs it, without its comment.
	Line string
	// Want are the parts of the comment after " # ", split at "…" (which
	// stands for output left out) and trimmed: each must appear in the
	// command's output, in this order. Empty when the line has no comment.
	Want []string
}

// Commands returns the non-blank lines of a shell block as commands. A
// comment starts at the first " # " of a line; docs keep that sequence out of
// their commands.
func Commands(b Block) []Command {
	var cmds []Command
	for _, line := range strings.Split(b.Text, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		c := Command{Line: line}
		if i := strings.Index(line, " # "); i >= 0 {
			c.Line = strings.TrimSpace(line[:i])
			c.Want = Fragments(line[i+3:])
		}
		cmds = append(cmds, c)
	}
	return cmds
}

// Fragments splits shown output at "…" (output left out) into the trimmed,
// non-empty parts that must appear.
func Fragments(shown string) []string {
	var parts []string
	for _, part := range strings.Split(shown, "…") {
		if part = strings.TrimSpace(part); part != "" {
			parts = append(parts, part)
		}
	}
	return parts
}

// CheckOutput returns nil if every fragment of want appears in out, in
// order, comparing with runs of white space (spaces, tabs, CR, LF) taken as
// one space; otherwise an error naming the first fragment missing.
func CheckOutput(out string, want []string) error {
	rest := squeeze(out)
	for _, w := range want {
		i := strings.Index(rest, squeeze(w))
		if i < 0 {
			return fmt.Errorf("output lacks %q (after the fragments before it):\n%s", w, out)
		}
		rest = rest[i+len(squeeze(w)):]
	}
	return nil
}

// squeeze replaces every run of white space in s by one space.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }
