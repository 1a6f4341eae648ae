// Package timeline formats a run as the producer's get and watch print it:
// a header (the run's identity, status, times, input and result, why a
// blocked run is blocked, the duplicate starts it absorbed) and then one aligned line per step in call
// order, with the failed earlier attempts of a step indented under it and
// the steps still open (running or retrying) and what the run waits for
// (a sleep, an event, a hook, a child run, with its deadline) at the end.
//
// Every text taken from a run (input, output, errors, names, sources) is
// escaped by Clean first: a control character in it (an ANSI escape
// sequence, a newline) is printed as a visible escape, so that stored data
// can neither break a line nor recolour the terminal.
package timeline

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jetflow/jetflow"
)

// Options says how a timeline is printed.
type Options struct {
	// Color colours the run's status with ANSI escapes (set it only when
	// the output is a terminal).
	Color bool
}

// Write prints tl: the header, then the step lines.
func Write(w io.Writer, tl jetflow.RunDescription, opts Options) error {
	f := NewFollower(opts)
	return f.Update(w, tl)
}

// columns are the step lines' column titles; the last one is not padded.
var columns = [...]string{"OFFSET", "DURATION", "NAME", "STEP ID", "ATTEMPT", "WORKER", "TASK KEY", "DETAIL"}

// row is one step line: a committed step, a failed earlier attempt
// (indented under its step) or an open step. key names it for Follower:
// a row once printed is not printed again.
type row struct {
	key   string
	cells [len(columns)]string
}

// Follower prints a timeline once, then, for each later reading of the
// same run, only what changed: the step lines not printed yet and a
// change of the run's status. The producer's watch uses it; Write is its
// first call.
type Follower struct {
	opts    Options
	started bool
	status  jetflow.RunStatus
	printed map[string]bool
	widths  [len(columns)]int
}

// NewFollower returns a Follower that has printed nothing yet.
func NewFollower(opts Options) *Follower {
	f := &Follower{opts: opts, printed: make(map[string]bool)}
	for i, c := range columns {
		f.widths[i] = len(c)
	}
	return f
}

// Update prints tl: the whole timeline on the first call; afterwards a
// line per step row not printed before (in call order) and a "status:"
// line when the run's status changed. The columns are as wide as the
// widest cell printed so far, so later lines line up with earlier ones
// unless they hold a wider cell.
func (f *Follower) Update(w io.Writer, tl jetflow.RunDescription) error {
	rows := rowsOf(tl)
	for _, r := range rows {
		f.grow(r)
	}
	var b strings.Builder
	if !f.started {
		f.started = true
		f.status = tl.Run.Status
		writeHeader(&b, tl.Run, f.opts)
		switch {
		case len(rows) == 0 && tl.Run.Status.Terminal():
			b.WriteString("steps: none\n")
		case len(rows) == 0:
			b.WriteString("steps: none yet\n")
		default:
			b.WriteString("steps:\n")
			f.line(&b, columns)
		}
	}
	for _, r := range rows {
		if f.printed[r.key] {
			continue
		}
		f.printed[r.key] = true
		f.line(&b, r.cells)
	}
	if tl.Run.Status != f.status {
		fmt.Fprintf(&b, "status: %s -> %s at %s%s\n", f.status, f.paint(tl.Run.Status),
			stamp(tl.Run.UpdatedAt), runResult(tl.Run))
		f.status = tl.Run.Status
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (f *Follower) grow(r row) {
	for i, c := range r.cells[:len(columns)-1] {
		f.widths[i] = max(f.widths[i], utf8.RuneCountInString(c))
	}
}

// line writes cells padded to the column widths, two spaces apart and
// indented by two, without trailing spaces.
func (f *Follower) line(b *strings.Builder, cells [len(columns)]string) {
	var l strings.Builder
	l.WriteString("  ")
	for i, c := range cells {
		l.WriteString(c)
		if i < len(cells)-1 {
			l.WriteString(strings.Repeat(" ", f.widths[i]-utf8.RuneCountInString(c)+2))
		}
	}
	b.WriteString(strings.TrimRight(l.String(), " "))
	b.WriteByte('\n')
}

// field is a label and its value, as writeFields aligns them.
type field struct{ label, value string }

// writeFields writes fields one a line after indent, the values aligned;
// an empty value is written "-".
func writeFields(b *strings.Builder, indent string, fields []field) {
	width := 0
	for _, f := range fields {
		width = max(width, len(f.label))
	}
	for _, f := range fields {
		if f.value == "" {
			f.value = "-"
		}
		fmt.Fprintf(b, "%s%-*s  %s\n", indent, width+1, f.label+":", f.value)
	}
}

// writeHeader writes the run's fields, aligned, why it is blocked, and its
// duplicate starts.
func writeHeader(b *strings.Builder, run jetflow.Run, opts Options) {
	fields := []field{
		{"run", Clean(run.RunID)},
		{"workflow", Clean(run.Workflow)},
		{"status", paint(run.Status, opts)},
		{"generation", strconv.Itoa(run.Generation)},
		{"source", Clean(run.Source)},
		{"created", stamp(run.CreatedAt)},
		{"updated", stamp(run.UpdatedAt)},
		{"duration", runDuration(run)},
		{"input", Clean(string(run.Input))},
	}
	if len(run.Output) > 0 {
		fields = append(fields, field{"output", Clean(string(run.Output))})
	}
	if run.Error != nil {
		fields = append(fields, field{"error", Clean(string(run.Error.Kind) + ": " + run.Error.Message)})
	}
	if p := run.Parent; p != nil {
		fields = append(fields, field{"parent", Clean(p.RunID + " (" + p.Workflow + ", step " + p.StepID + ")")})
	}
	for _, c := range run.Children {
		fields = append(fields, field{"child", Clean(c.RunID + " (" + c.Workflow + ", step " + c.StepID + ")")})
	}
	for _, w := range run.Waived {
		fields = append(fields, field{"waived", Clean(w)})
	}
	fields = append(fields, field{"duplicates", strconv.FormatInt(run.Duplicates, 10)})
	writeFields(b, "", fields)
	writeBlock(b, run)
	writeDuplicates(b, run)
}

// writeBlock writes why a blocked run is blocked: how its code diverges
// from its history, at which place, the history's step and the code's
// there, the build whose code it was, since when.
func writeBlock(b *strings.Builder, run jetflow.Run) {
	blk := run.Block
	if blk == nil {
		return
	}
	fmt.Fprintf(b, "blocked: %s: no step runs until code that replays its history takes it, or producer unblock %s\n", Clean(blk.Reason), Clean(run.RunID))
	var fields []field
	if d := blk.Divergence; d != nil {
		fields = append(fields, field{"kind", Clean(string(d.Kind))}, field{"place", strconv.Itoa(d.Position)},
			field{"history step", divergedStep(d.History)}, field{"code step", divergedStep(d.Code)}, field{"detail", Clean(d.Detail)})
	}
	fields = append(fields, field{"build", Clean(blk.Build)}, field{"worker", Clean(blk.Worker)},
		field{"since", stamp(blk.Since)})
	writeFields(b, "  ", fields)
}

// divergedStep names a step of a divergence report: its kind, name and
// step ID, or "none".
func divergedStep(s *jetflow.DivergedStep) string {
	if s == nil {
		return "none"
	}
	return Clean(s.String())
}

// writeDuplicates writes the first duplicate start and the recent ones:
// when, from which source, with which outcome.
func writeDuplicates(b *strings.Builder, run jetflow.Run) {
	if run.FirstDuplicate == nil {
		return
	}
	rows := [][4]string{{"AT", "SOURCE", "OUTCOME", "RUN WAS"}}
	add := func(d jetflow.DuplicateAttempt) {
		outcome := d.Outcome
		if !d.FingerprintMatch {
			outcome += " (other input)"
		}
		rows = append(rows, [4]string{stamp(d.At), Clean(d.Source), Clean(outcome), Clean(string(d.Status))})
	}
	add(*run.FirstDuplicate)
	if n := run.Duplicates - 1 - int64(len(run.RecentDuplicates)); n > 0 {
		rows = append(rows, [4]string{fmt.Sprintf("... %d more", n)})
	}
	for i, d := range run.RecentDuplicates {
		if i == 0 && run.Duplicates <= int64(len(run.RecentDuplicates)) {
			continue // the first one, shown above
		}
		add(d)
	}
	var widths [4]int
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	b.WriteString("duplicate starts (first, then the most recent):\n")
	for _, r := range rows {
		l := "  "
		for i, c := range r {
			l += c + strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2)
		}
		b.WriteString(strings.TrimRight(l, " ") + "\n")
	}
}

// rowsOf returns tl's step rows: each committed step in call order, its
// failed earlier attempts under it, then the open steps, then the open
// waits.
func rowsOf(tl jetflow.RunDescription) []row {
	start := tl.Run.CreatedAt
	var rows []row
	for _, s := range tl.Steps {
		began := s.StartedAt
		if began.IsZero() {
			began = s.CommittedAt
		}
		rows = append(rows, row{key: "step " + s.StepID, cells: [len(columns)]string{
			offset(start, began), span(s.StartedAt, s.CommittedAt), Clean(s.Name), Clean(s.StepID),
			strconv.Itoa(s.Attempt), Clean(worker(s)), taskKey(s.TaskKey), detail(s),
		}})
		rows = append(rows, attemptRows(start, s.StepID, s.Attempts)...)
	}
	for _, o := range tl.OpenSteps {
		state := "running"
		if len(o.Attempts) > 0 {
			state = fmt.Sprintf("retrying, attempt %d", o.Attempt)
		}
		var began time.Time
		if len(o.Attempts) > 0 {
			began = o.Attempts[0].StartedAt
		}
		rows = append(rows, attemptRows(start, o.StepID, o.Attempts)...)
		rows = append(rows, row{key: fmt.Sprintf("open %s %d", o.StepID, o.Attempt), cells: [len(columns)]string{
			offset(start, began), "-", Clean(o.Name), Clean(o.StepID), strconv.Itoa(o.Attempt), "-", "-", state,
		}})
	}
	for _, w := range tl.Waits {
		rows = append(rows, row{key: "wait " + w.StepID, cells: [len(columns)]string{
			offset(start, w.Since), "-", Clean(w.Name), Clean(w.StepID), "-", "-", "-", waiting(tl.Run.RunID, w),
		}})
	}
	return rows
}

// waiting says what an open wait of run runID waits for, until when, and
// for an event the producer command that sends it.
func waiting(runID string, w jetflow.OpenWait) string {
	var d, send string
	switch w.Kind {
	case "sleep":
		return "sleeping until " + stamp(w.Until)
	case "child":
		return "waiting for child run " + Clean(w.ChildRunID)
	case "hook":
		d = "waiting for hook " + Clean(w.Event) + " (token " + Clean(w.HookToken) + ")"
		send = "producer resume " + Clean(w.HookToken)
	default:
		d = "waiting for event " + Clean(w.Event)
		send = "producer send " + Clean(runID) + " " + Clean(w.Event)
	}
	if w.Until.IsZero() {
		d += ", no deadline"
	} else {
		d += " until " + stamp(w.Until)
	}
	return d + "; send it: " + send + " --event-id ID --data JSON"
}

// attemptRows are the indented lines of a step's failed attempts.
func attemptRows(start time.Time, stepID string, attempts []jetflow.StepAttempt) []row {
	var rows []row
	for _, a := range attempts {
		w := a.Worker
		if w == "" {
			w = "-"
		}
		rows = append(rows, row{key: fmt.Sprintf("attempt %s %d", stepID, a.Attempt), cells: [len(columns)]string{
			offset(start, a.StartedAt), span(a.StartedAt, a.EndedAt), "  failed", "", strconv.Itoa(a.Attempt),
			Clean(w), "", "error: " + Clean(a.Error),
		}})
	}
	return rows
}

// worker is the worker whose attempt was committed, without the note a
// served result adds (the task key column says it).
func worker(s jetflow.StepRecord) string {
	w, _, _ := strings.Cut(s.Worker, " (served from task key")
	if w == "" {
		return "-"
	}
	return w
}

// taskKey says whether a step called with a task key ran (miss) or was
// served from the key's cache (hit, and by which step).
func taskKey(k *jetflow.StepTaskKey) string {
	switch {
	case k == nil:
		return "-"
	case k.Served:
		return Clean(k.Key) + " hit (from " + Clean(k.From) + ")"
	default:
		return Clean(k.Key) + " miss"
	}
}

// detail is what a step waited for or started, and its error.
func detail(s jetflow.StepRecord) string {
	var parts []string
	switch s.Kind {
	case "sleep":
		parts = append(parts, "sleep until "+stamp(s.WakeAt))
	case "event", "hook":
		// The event the wait holds, and a hook's token; a wait that timed
		// out holds none, and its error below says what it waited for.
		d := s.Kind
		if s.EventID != "" {
			d += " " + Clean(s.EventID)
		}
		if s.HookToken != "" {
			d += " (token " + Clean(s.HookToken) + ")"
		}
		if d != s.Kind || s.Error == "" {
			parts = append(parts, d)
		}
	}
	if s.Child != "" {
		parts = append(parts, "child run "+Clean(s.Child))
	}
	switch {
	case s.Code == jetflow.CodeEventTimeout:
		// A wait's timeout is an outcome the workflow handles, not a
		// fault: "timed out: no event paid within 10s".
		parts = append(parts, "timed out: "+Clean(s.Error))
	case s.Fatal:
		parts = append(parts, "fatal error: "+Clean(s.Error))
	case s.Error != "":
		parts = append(parts, "error: "+Clean(s.Error))
	}
	return strings.Join(parts, "; ")
}

// offset is t's distance from the run's start, "-" when unknown.
func offset(start, t time.Time) string {
	if t.IsZero() || start.IsZero() {
		return "-"
	}
	return "+" + round(t.Sub(start))
}

// span is the time from begin to end, "-" when either is unknown.
func span(begin, end time.Time) string {
	if begin.IsZero() || end.IsZero() {
		return "-"
	}
	return round(end.Sub(begin))
}

// round is d to the millisecond, or to the microsecond below one (a
// step that took 300µs does not show as 0s).
func round(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d < time.Millisecond:
		d = d.Round(time.Microsecond)
	default:
		d = d.Round(time.Millisecond)
	}
	return d.String()
}

// runDuration is how long an ended run ran.
func runDuration(run jetflow.Run) string {
	if !run.Status.Terminal() {
		return "- (" + Clean(string(run.Status)) + ")"
	}
	return span(run.CreatedAt, run.UpdatedAt)
}

// runResult is an ended run's output or error, or how a blocked run
// diverges, for a status line.
func runResult(run jetflow.Run) string {
	switch {
	case run.Block != nil && run.Block.Divergence != nil:
		d := run.Block.Divergence
		return fmt.Sprintf(": %s at place %d", Clean(string(d.Kind)), d.Position)
	case run.Error != nil:
		return ": " + Clean(string(run.Error.Kind)+": "+run.Error.Message)
	case len(run.Output) > 0:
		return ": " + Clean(string(run.Output))
	}
	return ""
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ANSI colours of the statuses.
const (
	green   = "\x1b[32m"
	red     = "\x1b[31m"
	yellow  = "\x1b[33m"
	blue    = "\x1b[34m"
	magenta = "\x1b[35m"
	reset   = "\x1b[0m"
)

func (f *Follower) paint(s jetflow.RunStatus) string { return paint(s, f.opts) }

// paint is s, coloured when opts.Color.
func paint(s jetflow.RunStatus, opts Options) string {
	text := Clean(string(s))
	if !opts.Color {
		return text
	}
	color := blue
	switch s {
	case jetflow.StatusCompleted:
		color = green
	case jetflow.StatusFailed:
		color = red
	case jetflow.StatusCancelled:
		color = yellow
	case jetflow.StatusBlocked:
		color = magenta
	}
	return color + text + reset
}

// Clean returns s with every control and format character (ANSI escapes,
// newlines, tabs, bidirectional overrides) and every invalid UTF-8 byte
// replaced by a visible Go-style escape (\n, \x1b, \u202e), so that the
// text stays on its line and cannot change the terminal's state.
func Clean(s string) string {
	clean := true
	for _, r := range s {
		if needsEscape(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !needsEscape(r):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func needsEscape(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}
