package runindex

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jetflow/jetflow/internal/state"
)

// Subjects of the index stream. An entry's subject names the run's
// status, its workflow and its run ID, one character per token:
//
//	jetflow.runindex.e.<status>.<workflow>.<c1>.<c2>...<cn>.~
//
// so that every filter a page takes — status, workflow, run ID prefix,
// or any mix — is a subject filter the server answers from its subject
// index, never a scan of entries in the client. Run IDs are
// [A-Za-z0-9_=-], each character a valid token; "~" ends the ID, so that
// a prefix filter (…<c1>…<ck>.>) matches the run ID equal to the prefix
// too. builtSubject holds the marker of a complete index.
const (
	subjectPrefix = "jetflow.runindex."
	entryPrefix   = subjectPrefix + "e."
	idEnd         = "~"
	builtSubject  = subjectPrefix + "built"
)

// entrySubject is the subject of run's entry.
func entrySubject(status state.Status, workflow, runID string) string {
	var b strings.Builder
	b.Grow(len(entryPrefix) + len(status) + len(workflow) + 2*len(runID) + 4)
	b.WriteString(entryPrefix)
	b.WriteString(string(status))
	b.WriteByte('.')
	b.WriteString(workflow)
	b.WriteByte('.')
	writeChars(&b, runID)
	b.WriteString(idEnd)
	return b.String()
}

// runFilter matches every entry of runID, whatever its status and
// workflow.
func runFilter(runID string) string {
	var b strings.Builder
	b.WriteString(entryPrefix + "*.*.")
	writeChars(&b, runID)
	b.WriteString(idEnd)
	return b.String()
}

// writeChars writes s one character per token, each followed by a dot.
func writeChars(b *strings.Builder, s string) {
	for i := range len(s) {
		b.WriteByte(s[i])
		b.WriteByte('.')
	}
}

// filter is the subject filter of q's entries: its attribute's entries
// for a page by attribute.
func (q Query) filter() string {
	if q.AttrName != "" {
		return attrFilter(q.AttrName, q.AttrValue, q.Status, q.Workflow)
	}
	var b strings.Builder
	b.WriteString(entryPrefix)
	b.WriteString(orAny(string(q.Status)))
	b.WriteByte('.')
	b.WriteString(orAny(q.Workflow))
	b.WriteByte('.')
	writeChars(&b, q.Prefix)
	b.WriteByte('>')
	return b.String()
}

func orAny(token string) string {
	if token == "" {
		return "*"
	}
	return token
}

// EncodeCursor and ParseCursor: a page's Next is the stream sequence of its last
// entry, written "c" + decimal; the next page holds older entries. It is
// opaque to callers, and checked when read back.
func EncodeCursor(seq uint64) string { return "c" + strconv.FormatUint(seq, 10) }

// ParseCursor reads a cursor RunPage.Next gave; "" is the first page (0).
func ParseCursor(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	digits, ok := strings.CutPrefix(s, "c")
	seq, err := strconv.ParseUint(digits, 10, 64)
	if !ok || err != nil || seq == 0 || EncodeCursor(seq) != s {
		return 0, fmt.Errorf("cursor %q: not one a page returned", clip(s))
	}
	return seq, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
