package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jetflow/jetflow"
	"github.com/stretchr/testify/require"
)

// get on a run whose step failed twice before it committed, started twice
// under its run ID: the header, the duplicate start, the step line with its
// step ID and attempt 3, and the two failed attempts indented under it.
func TestGetTimeline(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	for range 2 {
		code, _, errOut := producer("start", "flaky", `{"name":"visa"}`, "--id", "tl-1")
		require.Equal(t, 0, code, errOut)
	}
	code, _, errOut := producer("wait", "tl-1")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("get", "tl-1")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "\x1b", "no colour off a terminal")
	head, steps, ok := strings.Cut(out, "steps:\n")
	require.True(t, ok, out)
	require.Contains(t, head, "run:         tl-1\n")
	require.Contains(t, head, "workflow:    flaky\n")
	require.Contains(t, head, "status:      completed\n")
	require.Contains(t, head, "generation:  0\n")
	require.Regexp(t, `(?m)^duration:    \d`, head)
	require.Contains(t, head, `output:      "visa"`)
	require.Contains(t, head, "duplicates:  1\n")
	require.Regexp(t, `(?m)^  \S+Z\s+producer\s+existing\s+(running|completed)$`, head, "the duplicate: when, source, outcome")

	lines := strings.Split(strings.TrimSuffix(steps, "\n"), "\n")
	require.Len(t, lines, 4, steps)
	require.Regexp(t, `^  OFFSET\s+DURATION\s+NAME\s+STEP ID\s+ATTEMPT\s+WORKER\s+TASK KEY\s+DETAIL$`, lines[0])
	require.Regexp(t, `^  \+\S+\s+\S+\s+charge\s+tl-1\.charge\.0\s+3\s+\S+\s+-$`, lines[1])
	for i, l := range lines[2:] {
		require.Regexp(t, `^  \+\S+\s+\S+\s+failed\s+`+string(rune('1'+i))+`\s+\S+\s+error: declined: visa$`, l)
	}
	// Aligned on screen: the same number of characters (not bytes: "µs")
	// before each line's attempt.
	col := utf8.RuneCountInString(lines[0][:strings.Index(lines[0], "ATTEMPT")])
	require.Equal(t, '3', []rune(lines[1])[col], "aligned")
	require.Equal(t, '1', []rune(lines[2])[col], "aligned")

	code, out, errOut = producer("get", "tl-1", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var run jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(out), &run), out)
	require.Contains(t, out, `"open_steps": []`)
	require.Len(t, run.Steps, 1)
	require.Len(t, run.Steps[0].Attempts, 2)
	require.Equal(t, "declined: visa", run.Steps[0].Attempts[1].Error)
}

// An error message with ANSI escapes and line breaks, stored by the
// workflow, is printed escaped: nothing on the terminal changes colour,
// every step line stays one line.
func TestGetEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	name := "\x1b[31mred\x1b[0m\nsecond line\r\x1b]0;title\x07"
	in, err := json.Marshal(map[string]string{"name": name})
	require.NoError(t, err)
	code, _, errOut := producer("start", "flaky", string(in), "--id", "tl-h")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("wait", "tl-h")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("get", "tl-h")
	require.Equal(t, 0, code, errOut)
	for _, c := range []string{"\x1b", "\r", "\x07"} {
		require.NotContains(t, out, c)
	}
	require.Contains(t, out, `error: declined: \x1b[31mred\x1b[0m\nsecond line\r\x1b]0;title\x07`+"\n")
	_, steps, _ := strings.Cut(out, "steps:\n")
	require.Len(t, strings.Split(strings.TrimSuffix(steps, "\n"), "\n"), 4, "one line per step and attempt: %s", steps)
}

// A failed run's error, printed by wait and watch, shows what the
// workflow wrote with its control characters escaped.
func TestErrorLineEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	in, err := json.Marshal(map[string]string{"name": "nobody\x1b[31mRED\x1b[0m\nFAKE LINE"})
	require.NoError(t, err)
	code, _, errOut := producer("start", "greet", string(in), "--id", "esc-1")
	require.Equal(t, 0, code, errOut)
	for _, cmd := range []string{"wait", "watch"} {
		code, _, errOut = producer(cmd, "esc-1")
		require.NotEqual(t, 0, code, "the run failed")
		require.NotContains(t, errOut, "\x1b", cmd)
		require.Contains(t, errOut, `cannot greet nobody\x1b[31mRED\x1b[0m\nFAKE LINE`, cmd)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%s: one line: %q", cmd, errOut)
	}
}

// watchLines runs producer watch in the background and returns its lines
// as they are printed, and its exit code once it ends.
func watchLines(t *testing.T, tb *testbed, args ...string) (<-chan string, <-chan int) {
	t.Helper()
	pr, pw := io.Pipe()
	lines := make(chan string, 256)
	exit := make(chan int, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	go func() {
		var stderr strings.Builder
		code := run(ctx, append([]string{"watch"}, args...), tb.env(nil), pw, &stderr)
		if stderr.Len() > 0 {
			t.Logf("watch stderr: %s", stderr.String())
		}
		pw.Close()
		exit <- code
	}()
	return lines, exit
}

// await reads lines until one matches re, and returns it.
func await(t *testing.T, lines <-chan string, re string) string {
	t.Helper()
	r := regexp.MustCompile(re)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "watch ended before printing a line matching %s", re)
			if r.MatchString(l) {
				return l
			}
		case <-deadline:
			t.Fatalf("no line matching %s", re)
		}
	}
}

// watch prints the timeline of a waiting run, then the step of each event
// as it arrives and the status change, and exits 0 when the run ends.
func TestWatchFollowsRun(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("start", "inbox", `""`, "--id", "w-1")
	require.Equal(t, 0, code, errOut)

	lines, exit := watchLines(t, tb, "w-1", "--interval", "100ms")
	await(t, lines, `^status:\s+running$`)
	await(t, lines, `^steps:`)

	code, _, errOut = producer("send", "w-1", "paid", "--event-id", "pay-1", "--data", `{"ref":"r-7"}`)
	require.Equal(t, 0, code, errOut)
	await(t, lines, `^  \+\S+\s+\S+\s+event=paid\s+w-1\.event=paid\.0\s+1\s.*event pay-1$`)

	code, _, errOut = producer("send", "w-1", "done", "--event-id", "done-1")
	require.Equal(t, 0, code, errOut)
	await(t, lines, `event=done\s+w-1\.event=done\.0\s.*event done-1$`)
	await(t, lines, `^status: running -> completed at \S+: "r-7"$`)
	select {
	case code := <-exit:
		require.Equal(t, exitOK, code)
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not end with the run")
	}
	for l := range lines {
		t.Errorf("a line after the end: %q", l)
	}
}

// watch on a run that fails or is cancelled exits as wait does (2); on an
// unknown run 3.
func TestWatchExitCodes(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("start", "hold", `{"name":"x"}`, "--id", "w-2")
	require.Equal(t, 0, code, errOut)
	lines, exit := watchLines(t, tb, "w-2")
	await(t, lines, `^steps: none yet$`)
	code, _, errOut = producer("cancel", "w-2")
	require.Equal(t, 0, code, errOut)
	await(t, lines, `^status: running -> cancelled`)
	require.Equal(t, exitRunFailed, <-exit)

	code, _, errOut = producer("watch", "nope-1")
	require.Equal(t, exitNotFound, code, errOut)

	// --output json: the run's body, one line per change; an ended run
	// prints once.
	code, out, errOut := producer("watch", "w-2", "--output", "json")
	require.Equal(t, exitRunFailed, code, errOut)
	require.Equal(t, 1, strings.Count(out, "\n"), out)
	var run jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(out), &run))
	require.Equal(t, "cancelled", string(run.Status))
	require.NotNil(t, run.OpenSteps)
}
