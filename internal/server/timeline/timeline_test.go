package timeline

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// t0 is the fixtures' run start.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// completed is an ended run with a step retried twice, a step served from
// a task key, a sleep, an event, a child and two duplicate starts.
func completed() jetflow.RunDescription {
	dup := jetflow.DuplicateAttempt{At: at(time.Second), Source: "http", Outcome: "existing", FingerprintMatch: true, Status: jetflow.StatusRunning}
	dup2 := jetflow.DuplicateAttempt{At: at(3 * time.Second), Source: "producer", Outcome: "conflict", Status: jetflow.StatusCompleted}
	return jetflow.RunDescription{
		Run: jetflow.Run{RunID: "order-1", Workflow: "order", Status: jetflow.StatusCompleted, Source: "producer",
			CreatedAt: t0, UpdatedAt: at(2500 * time.Millisecond), Duplicates: 2, FirstDuplicate: &dup,
			RecentDuplicates: []jetflow.DuplicateAttempt{dup, dup2},
			Input:            json.RawMessage(`{"id":1}`), Output: json.RawMessage(`"done"`)},
		Steps: []jetflow.StepRecord{
			{StepID: "order-1.charge.0", Name: "charge", Attempt: 3, Worker: "w-1", StartedAt: at(300 * time.Millisecond),
				CommittedAt: at(320 * time.Millisecond), Output: json.RawMessage(`"ch_1"`),
				Attempts: []jetflow.StepAttempt{
					{Attempt: 1, StartedAt: at(10 * time.Millisecond), EndedAt: at(15 * time.Millisecond), Worker: "w-1", Error: "card declined"},
					{Attempt: 2, StartedAt: at(115 * time.Millisecond), EndedAt: at(116 * time.Millisecond), Worker: "w-2", Error: "timeout"},
				}},
			{StepID: "order-1.email.0", Name: "email", Attempt: 1, Worker: "w-2 (served from task key w.order.ab.email, result of order-0.email.0)",
				StartedAt: at(400 * time.Millisecond), CommittedAt: at(400*time.Millisecond + 300*time.Microsecond),
				TaskKey: &jetflow.StepTaskKey{Key: "w.order.ab.email", Served: true, From: "order-0.email.0"}},
			{StepID: "order-1.nap.0", Name: "nap", Attempt: 1, Kind: "sleep", WakeAt: at(1400 * time.Millisecond),
				StartedAt: at(410 * time.Millisecond), CommittedAt: at(1402 * time.Millisecond)},
			{StepID: "order-1.event=paid.0", Name: "event=paid", Attempt: 1, Kind: "event", EventID: "pay-1",
				StartedAt: at(1500 * time.Millisecond), CommittedAt: at(2 * time.Second), Output: json.RawMessage(`{}`)},
			{StepID: "order-1.ship.0", Name: "ship", Attempt: 1, Child: "order-1-ship", Worker: "w-1",
				StartedAt: at(2100 * time.Millisecond), CommittedAt: at(2400 * time.Millisecond)},
		},
	}
}

// running is a run with one committed step, one step retrying and one
// running.
func running() jetflow.RunDescription {
	return jetflow.RunDescription{
		Run: jetflow.Run{RunID: "r-2", Workflow: "wf", Status: jetflow.StatusRunning, CreatedAt: t0, UpdatedAt: t0,
			Input: json.RawMessage(`{}`)},
		Steps: []jetflow.StepRecord{{StepID: "r-2.a.0", Name: "a", Attempt: 1, Worker: "w-1", StartedAt: at(time.Millisecond),
			CommittedAt: at(5 * time.Millisecond), TaskKey: &jetflow.StepTaskKey{Key: "r.r-2.cd.a", From: "r-2.a.0"}}},
		OpenSteps: []jetflow.OpenStep{
			{StepID: "r-2.b.0", Name: "b", Attempt: 2, Attempts: []jetflow.StepAttempt{
				{Attempt: 1, StartedAt: at(10 * time.Millisecond), EndedAt: at(20 * time.Millisecond), Worker: "w-1", Error: "boom"}}},
			{StepID: "r-2.c.0", Name: "c", Attempt: 1},
		},
	}
}

// hostile has control characters in every text a run carries.
func hostile() jetflow.RunDescription {
	return jetflow.RunDescription{
		Run: jetflow.Run{RunID: "h-1", Workflow: "wf", Status: jetflow.StatusFailed, Source: "src\x1b[2J",
			CreatedAt: t0, UpdatedAt: at(time.Second), Input: json.RawMessage("{\"a\":\n\"\\u001b\"}"),
			Error: &jetflow.RunError{Kind: "step", Message: "bad\x1b[31mred\nsecond line\u202e\xff"}},
		Steps: []jetflow.StepRecord{{StepID: "h-1.s.0", Name: "s", Attempt: 2, Error: "x\x1b]0;title\x07y", Worker: "w\r1",
			StartedAt: at(time.Millisecond), CommittedAt: at(2 * time.Millisecond),
			Attempts: []jetflow.StepAttempt{{Attempt: 1, StartedAt: at(0), EndedAt: at(time.Millisecond), Error: "\x1b[1mbold\tx"}}}},
	}
}

// blocked is a run blocked by a renamed step, after an earlier block an
// operator accepted (a waived step).
func blocked() jetflow.RunDescription {
	return jetflow.RunDescription{
		Run: jetflow.Run{RunID: "s-7", Workflow: "signup", Status: jetflow.StatusBlocked, CreatedAt: t0, UpdatedAt: at(2 * time.Second),
			Input: json.RawMessage(`"ann"`), Waived: []string{"s-7.send-sms.0"},
			Block: &jetflow.RunBlock{Reason: "divergence", Build: "4be1c2a9d0f3", Worker: "w-2", Since: at(2 * time.Second),
				Divergence: &jetflow.Divergence{Kind: "renamed", Position: 1,
					History: &jetflow.DivergedStep{StepID: "s-7.send-welcome.0", Name: "send-welcome", Kind: "step"},
					Code:    &jetflow.DivergedStep{StepID: "s-7.send-welcome-email.0", Name: "send-welcome-email", Kind: "step"},
					Detail:  "a step the history does not hold in place of one the code never starts: it would run again"}}},
		Steps: []jetflow.StepRecord{
			{StepID: "s-7.send-welcome.0", Name: "send-welcome", Attempt: 1, Worker: "w-1", StartedAt: at(time.Millisecond), CommittedAt: at(3 * time.Millisecond)},
		},
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), got)
}

func render(t *testing.T, tl jetflow.RunDescription, opts Options) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, Write(&b, tl, opts))
	return b.String()
}

// The whole timeline of an ended run, a running one, a blocked one and
// one full of control characters, as golden text.
func TestWriteGolden(t *testing.T) {
	t.Parallel()
	for name, tl := range map[string]jetflow.RunDescription{"completed": completed(), "running": running(), "hostile": hostile(), "blocked": blocked()} {
		golden(t, name, render(t, tl, Options{}))
	}
}

// The step lines are aligned: every column starts at the same place on
// each line of the step table.
func TestStepColumnsAligned(t *testing.T) {
	t.Parallel()
	out := render(t, completed(), Options{})
	_, table, ok := strings.Cut(out, "steps:\n")
	require.True(t, ok)
	var lines [][]rune // on screen a character is a column, not a byte ("µs")
	for _, l := range strings.Split(strings.TrimSuffix(table, "\n"), "\n") {
		lines = append(lines, []rune(l))
	}
	require.Len(t, lines, 8) // title, 5 steps, 2 failed attempts
	column := func(title string) int {
		return utf8.RuneCountInString(string(lines[0])[:strings.Index(string(lines[0]), title)])
	}
	col := column("STEP ID")
	for _, l := range lines[1:] {
		if strings.Contains(string(l), "failed") {
			continue // no step ID on an attempt's line
		}
		require.Equal(t, "order-1.", string(l[col:col+len("order-1.")]), "line %q", string(l))
	}
	require.Contains(t, string(lines[4]), "300µs")
	attempt := column("ATTEMPT")
	for i, want := range []rune{'3', '1', '2', '1'} {
		require.Equal(t, want, lines[i+1][attempt], "line %q", string(lines[i+1]))
	}
}

// Stored text cannot put an escape character or a line break on the
// terminal: the hostile run prints no ESC, BEL, CR, tab or U+202E, and
// as many lines as a clean run of the same shape.
func TestHostileTextEscaped(t *testing.T) {
	t.Parallel()
	out := render(t, hostile(), Options{})
	for _, bad := range []string{"\x1b", "\x07", "\r", "\t", "\u202e", "\xff"} {
		require.NotContains(t, out, bad)
	}
	require.Contains(t, out, `bad\x1b[31mred\nsecond line\u202e\xff`)
	clean := hostile()
	clean.Run.Source, clean.Run.Input = "src", json.RawMessage(`{}`)
	clean.Run.Error.Message, clean.Steps[0].Error, clean.Steps[0].Worker, clean.Steps[0].Attempts[0].Error = "m", "e", "w", "e"
	require.Equal(t, strings.Count(render(t, clean, Options{}), "\n"), strings.Count(out, "\n"))
}

// Colour is only added when asked for, and only around the status.
func TestColor(t *testing.T) {
	t.Parallel()
	require.NotContains(t, render(t, completed(), Options{}), "\x1b")
	out := render(t, completed(), Options{Color: true})
	require.Contains(t, out, "status:      \x1b[32mcompleted\x1b[0m\n")
	require.Equal(t, 2, strings.Count(out, "\x1b"))
}

func TestRound(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 412345 * time.Nanosecond: "412µs",
		1234567 * time.Nanosecond: "1ms", 61500 * time.Millisecond: "1m1.5s",
	} {
		require.Equal(t, want, round(d), "%d", d)
	}
}

func TestClean(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain":        "plain",
		"héllo 世界":     "héllo 世界",
		"a\nb":         `a\nb`,
		"\x1b[0m":      `\x1b[0m`,
		"\u0085\u200b": `\x85\u200b`,
		"bad\xffutf8":  `bad\xffutf8`,
		`back\slash`:   `back\slash`,
	} {
		require.Equal(t, want, Clean(in), "Clean(%q)", in)
	}
}

// A Follower prints the timeline, then only the lines that are new: a
// step that committed, a step that failed an attempt, and the change of
// status, once each.
func TestFollowerPrintsChanges(t *testing.T) {
	t.Parallel()
	tl := running()
	f := NewFollower(Options{})
	var b bytes.Buffer
	require.NoError(t, f.Update(&b, tl))
	require.Equal(t, render(t, tl, Options{}), b.String())

	b.Reset()
	require.NoError(t, f.Update(&b, tl))
	require.Empty(t, b.String(), "nothing changed")

	// b failed again and c committed.
	tl.OpenSteps[0].Attempt = 3
	tl.OpenSteps[0].Attempts = append(tl.OpenSteps[0].Attempts, jetflow.StepAttempt{Attempt: 2, StartedAt: at(30 * time.Millisecond),
		EndedAt: at(40 * time.Millisecond), Worker: "w-2", Error: "boom again"})
	tl.Steps = append(tl.Steps, jetflow.StepRecord{StepID: "r-2.c.0", Name: "c", Attempt: 1, Worker: "w-1",
		StartedAt: at(50 * time.Millisecond), CommittedAt: at(60 * time.Millisecond)})
	tl.OpenSteps = tl.OpenSteps[:1]
	require.NoError(t, f.Update(&b, tl))
	golden(t, "follow-1", b.String())

	// b committed, the run completed.
	b.Reset()
	tl.OpenSteps = nil
	tl.Steps = append(tl.Steps, jetflow.StepRecord{StepID: "r-2.b.0", Name: "b", Attempt: 3, Worker: "w-1",
		StartedAt: at(70 * time.Millisecond), CommittedAt: at(80 * time.Millisecond)})
	tl.Run.Status, tl.Run.UpdatedAt, tl.Run.Output = jetflow.StatusCompleted, at(90*time.Millisecond), json.RawMessage(`42`)
	require.NoError(t, f.Update(&b, tl))
	golden(t, "follow-2", b.String())
}

// A run without steps says so: "none yet" while it runs, "none" once
// ended; a step that commits later brings the column titles with it.
func TestNoSteps(t *testing.T) {
	t.Parallel()
	tl := jetflow.RunDescription{Run: jetflow.Run{RunID: "n-1", Workflow: "wf", Status: jetflow.StatusRunning, CreatedAt: t0, UpdatedAt: t0}}
	require.True(t, strings.HasSuffix(render(t, tl, Options{}), "duplicates:  0\nsteps: none yet\n"))
	ended := tl
	ended.Run.Status = jetflow.StatusFailed
	require.True(t, strings.HasSuffix(render(t, ended, Options{}), "duplicates:  0\nsteps: none\n"))
}

// A waiting run's open waits follow its steps, each saying what it waits
// for and until when; watch prints a wait once, and the committed step
// that ends it when it comes.
func TestOpenWaits(t *testing.T) {
	t.Parallel()
	run := jetflow.Run{RunID: "w-1", Workflow: "wf", Status: jetflow.StatusRunning, CreatedAt: t0, UpdatedAt: t0}
	tl := jetflow.RunDescription{Run: run, Waits: []jetflow.OpenWait{
		{StepID: "w-1.event=paid.0", Name: "event=paid", Kind: "event", Event: "paid", Since: at(2 * time.Second), Until: at(time.Hour)},
		{StepID: "w-1.hook=ok.1", Name: "hook=ok", Kind: "hook", Event: "ok", HookToken: "tok-1", Since: at(2 * time.Second)},
		{StepID: "w-1.kid.2", Name: "kid", Kind: "child", ChildRunID: "w-1=kid=0", Since: at(3 * time.Second)},
		{StepID: "w-1.nap.3", Name: "nap", Kind: "sleep", Since: at(4 * time.Second), Until: at(24 * time.Hour)},
	}}
	out := render(t, tl, Options{})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Equal(t, []string{
		"+2s - event=paid w-1.event=paid.0 - - - waiting for event paid until " + stamp(at(time.Hour)) + "; send it: producer send w-1 paid --event-id ID --data JSON",
		"+2s - hook=ok w-1.hook=ok.1 - - - waiting for hook ok (token tok-1), no deadline; send it: producer resume tok-1 --event-id ID --data JSON",
		"+3s - kid w-1.kid.2 - - - waiting for child run w-1=kid=0",
		"+4s - nap w-1.nap.3 - - - sleeping until " + stamp(at(24*time.Hour)),
	}, squeeze(lines[len(lines)-4:]))
	f := NewFollower(Options{})
	var b strings.Builder
	require.NoError(t, f.Update(&b, tl))
	b.Reset()
	require.NoError(t, f.Update(&b, tl))
	require.Empty(t, b.String(), "a wait is printed once")
	tl.Waits = tl.Waits[1:]
	tl.Steps = []jetflow.StepRecord{{StepID: "w-1.event=paid.0", Name: "event=paid", Attempt: 1, Kind: "event", EventID: "e-1",
		StartedAt: at(2 * time.Second), CommittedAt: at(5 * time.Second)}}
	require.NoError(t, f.Update(&b, tl))
	require.Contains(t, b.String(), "event e-1")
}

// squeeze joins each line's fields with one space.
func squeeze(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.Join(strings.Fields(l), " ")
	}
	return out
}

// A run that becomes blocked is followed with a status line that says how
// it diverges and where; the block's report follows the header, its
// reason first; a blocked status is coloured apart from running.
func TestBlockedRun(t *testing.T) {
	t.Parallel()
	tl := running()
	f := NewFollower(Options{})
	var b strings.Builder
	require.NoError(t, f.Update(&b, tl))
	b.Reset()
	bl := blocked()
	tl.Run.Status, tl.Run.UpdatedAt, tl.Run.Block = bl.Run.Status, at(time.Second), bl.Run.Block
	require.NoError(t, f.Update(&b, tl))
	require.Contains(t, b.String(), "status: running -> blocked at "+stamp(at(time.Second))+": renamed at place 1\n")

	out := render(t, blocked(), Options{})
	require.Contains(t, out, "duration:    - (blocked)\n")
	require.Contains(t, out, "blocked: divergence: no step runs until code that replays its history takes it, or producer unblock s-7\n")
	for _, line := range []string{"history step:  step send-welcome (s-7.send-welcome.0)", "code step:     step send-welcome-email (s-7.send-welcome-email.0)",
		"build:         4be1c2a9d0f3", "since:         " + stamp(at(2*time.Second))} {
		require.Contains(t, out, "\n  "+line+"\n")
	}
	require.Contains(t, render(t, blocked(), Options{Color: true}), "status:      \x1b[35mblocked\x1b[0m\n")

	// A block without a report, or whose report names no step.
	bare := blocked()
	bare.Run.Block.Divergence.History, bare.Run.Block.Divergence.Code, bare.Run.Block.Build = nil, nil, ""
	out = render(t, bare, Options{})
	require.Contains(t, out, "\n  history step:  none\n")
	require.Contains(t, out, "\n  build:         -\n")
	bare.Run.Block.Divergence = nil
	require.NotContains(t, render(t, bare, Options{}), "place:")
}
