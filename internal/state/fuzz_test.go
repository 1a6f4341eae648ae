package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The decoders are the only code that reads bytes from outside (the task
// stream, the buckets, which anyone with NATS access can write). Every fuzz
// target below checks the same properties of one decoder:
//
//   - it never panics, and every rejection wraps ErrCorrupt;
//   - an accepted record is valid by the rules checked here, independently
//     of the decoder (identifiers within their limits and alphabet, known
//     status, consistent step identity, JSON payloads);
//   - it round-trips: Encode accepts it, the encoding decodes again to the
//     same record, and encoding that gives the same bytes (a fixed point);
//   - Encode never makes an input or output longer (it only compacts), which
//     is what keeps a maximal input within a NATS message (see ids.go).
//
// Seeds are the f.Add calls and the files under testdata/fuzz/<FuzzName>/.

func FuzzDecodeRun(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"run_id":"order-42","workflow":"checkout","input":{"sku":"a","qty":2},"status":"running","token":"T0k3n","source":"go-sdk","created_at":"2024-05-01T10:00:00Z","updated_at":"2024-05-01T10:00:00Z"}`,
		`{"v":1,"run_id":"b64==","workflow":"w","input":null,"status":"completed","token":"t","created_at":"2024-05-01T10:00:00.123456789+02:00","updated_at":"2024-05-01T10:00:01Z","output":[1, 2 ,3]}`,
		`{"v":1,"run_id":"r","workflow":"w","input":"<&>\u2028","status":"failed","token":"t","created_at":"0001-01-01T00:00:00Z","updated_at":"9999-12-31T23:59:59-23:59","error":{"message":"boom","fatal":true,"kind":"step"}}`,
		`{"v":1,"run_id":"r","workflow":"w","status":"cancelled"}`,
		`{"run_id":"a b","workflow":"w","status":"running"}`,
		`{"run_id":"r","workflow":"w","status":"sleeping"}`,
		`{"run_id":"r","workflow":"w.x","status":"running"}`,
		`{"run_id":"r","workflow":"w","status":"running","created_at":"10000-01-01T00:00:00Z"}`,
		`{"run_id":"r","workflow":"w","status":"running","input":{`,
		`null`, `[]`, `{}`, ``, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRun(b)
		if err != nil {
			requireCorrupt(t, err)
			return
		}
		checkRun(t, r)
		b2 := mustEncode(t, r)
		r2, err := DecodeRun(b2)
		if err != nil {
			t.Fatalf("re-encoded run %s does not decode: %v", b2, err)
		}
		checkRun(t, r2)
		if !sameRun(r, r2) {
			t.Fatalf("run changed in a round trip:\n%#v\n%#v", r, r2)
		}
		fixedPoint(t, b2, r2)
	})
}

func FuzzDecodeTask(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"run_id":"stripe-evt_123","workflow":"webhook","input":{"id":"evt_123"},"token":"tok","source":"producer"}`,
		`{"v":1,"run_id":"order-42","workflow":"checkout","step_id":"order-42.charge.0","input":1,"token":"tok","created_at":"2024-05-01T10:00:00Z","rev":17}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"r.a.10","input":"<\u2028>","created_at":"0001-01-01T01:00:00+01:00"}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"other.a.0","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"r.a.01","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"r.a.-1","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"r.a","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","step_id":"r.a.b.0","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","input":1}`,
		`{"v":1,"run_id":"r","workflow":"w","token":"t"}`,
		`{"v":1,"run_id":"r","workflow":"w","token":"t","input":[1,`,
		`{"v":1,"run_id":"r","workflow":"w","token":"t","input":1,"rev":-1}`,
		`garbage`, `{}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		task, err := DecodeTask(b)
		if err != nil {
			requireCorrupt(t, err)
			return
		}
		checkTask(t, task)
		b2 := mustEncode(t, task)
		task2, err := DecodeTask(b2)
		if err != nil {
			t.Fatalf("re-encoded task %s does not decode: %v", b2, err)
		}
		checkTask(t, task2)
		if !sameTask(task, task2) {
			t.Fatalf("task changed in a round trip:\n%#v\n%#v", task, task2)
		}
		fixedPoint(t, b2, task2)
		// The run record a step task stands for is valid too.
		if task.StepID != "" {
			checkRun(t, RunFromTask(task))
		}
	})
}

func FuzzDecodeStep(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"step_id":"order-42.charge.0","run_id":"order-42","name":"charge","seq":0,"attempt":1,"output":{"charge":"ch_1"},"worker":"w-1","committed_at":"2024-05-01T10:00:00Z"}`,
		`{"v":1,"step_id":"r.send-email.3","run_id":"r","name":"send-email","seq":7,"attempt":5,"error":{"message":"smtp down","kind":"step"},"committed_at":"2024-05-01T10:00:00.5+05:30"}`,
		`{"v":1,"step_id":"r.a.0","run_id":"r","name":"a","output":"\u003c<"}`,
		`{"step_id":"x"}`,
		`{"step_id":"r.a.0","run_id":"r","name":"b"}`,
		`{"step_id":"s.a.0","run_id":"r","name":"a"}`,
		`{"step_id":"r a.a.0","run_id":"r a","name":"a"}`,
		`{"step_id":"r.a.0","run_id":"r","name":"a","seq":-1}`,
		`{"step_id":"r.a.x","run_id":"r","name":"a"}`,
		`{"step_id":"r.a.0","run_id":"r","name":"a","output":}`,
		`[]`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeStep(b)
		if err != nil {
			requireCorrupt(t, err)
			return
		}
		checkStep(t, s)
		b2 := mustEncode(t, s)
		s2, err := DecodeStep(b2)
		if err != nil {
			t.Fatalf("re-encoded step %s does not decode: %v", b2, err)
		}
		checkStep(t, s2)
		if !sameStep(s, s2) {
			t.Fatalf("step changed in a round trip:\n%#v\n%#v", s, s2)
		}
		fixedPoint(t, b2, s2)
	})
}

func FuzzDecodeAudit(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"duplicates":3,"first":{"at":"2024-05-01T10:00:00Z","source":"producer","outcome":"existing","fingerprint_match":true,"status":"running"},"recent":[{"at":"2024-05-02T10:00:00Z","outcome":"conflict"}]}`,
		`{"v":1,"duplicates":9223372036854775807,"first":{"at":"2024-05-01T10:00:00Z","outcome":"existing"}}`,
		`{"duplicates":1,"first":{"at":"2024-05-01T10:00:00Z","outcome":"maybe"}}`,
		`{"duplicates":0,"first":{"at":"2024-05-01T10:00:00Z","outcome":"existing"}}`,
		`{"duplicates":-1}`,
		`{"duplicates":1.5}`,
		`{"duplicates":9223372036854775808}`,
		`{"first":{"at":"yesterday"}}`,
		`{}`, `null`, `[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAudit(b)
		if err != nil {
			requireCorrupt(t, err)
			return
		}
		if a.Duplicates < 0 || len(a.Recent) > AuditRecent || int64(len(a.Recent)) > a.Duplicates {
			t.Fatalf("inconsistent audit accepted: %#v", a)
		}
		b2 := mustEncode(t, a)
		a2, err := DecodeAudit(b2)
		if err != nil {
			t.Fatalf("re-encoded audit %s does not decode: %v", b2, err)
		}
		if a.V != a2.V || a.Duplicates != a2.Duplicates || len(a.Recent) != len(a2.Recent) || (a.First == nil) != (a2.First == nil) {
			t.Fatalf("audit changed in a round trip:\n%#v\n%#v", a, a2)
		}
		fixedPoint(t, b2, a2)
	})
}

func FuzzDecodeExpiry(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"runs":[{"run_id":"order-42","token":"T0k3n"},{"run_id":"order-7","generation":3,"token":"t"}],"due":"2024-05-31T10:00:00Z"}`,
		`{"v":1,"runs":[],"due":"2024-05-31T10:00:00.5+02:00"}`,
		`{"runs":[{"run_id":"a b"}]}`,
		`{"runs":[{"run_id":"r","generation":-1}]}`,
		`{"runs":[{"run_id":""}]}`,
		`{"runs":{"run_id":"r"}}`,
		`{"due":"10000-01-01T00:00:00Z"}`,
		`{}`, `null`, `[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeExpiry(b)
		if err != nil {
			requireCorrupt(t, err)
			return
		}
		for _, r := range e.Runs {
			checkRunID(t, r.RunID)
			if r.Generation < 0 {
				t.Fatalf("negative generation accepted: %#v", r)
			}
		}
		b2 := mustEncode(t, e)
		e2, err := DecodeExpiry(b2)
		if err != nil {
			t.Fatalf("re-encoded expiry %s does not decode: %v", b2, err)
		}
		if e.V != e2.V || !sameTime(e.Due, e2.Due) || !slices.Equal(e.Runs, e2.Runs) {
			t.Fatalf("expiry changed in a round trip:\n%#v\n%#v", e, e2)
		}
		fixedPoint(t, b2, e2)
	})
}

// requireCorrupt fails unless err is a typed rejection.
func requireCorrupt(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("rejection does not wrap ErrCorrupt: %v", err)
	}
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Encode(v)
	if err != nil {
		t.Fatalf("decoded record does not encode: %v\n%#v", err, v)
	}
	return b
}

// fixedPoint checks that encoding the decoded encoding gives the same bytes.
func fixedPoint(t *testing.T, b []byte, v any) {
	t.Helper()
	if b2 := mustEncode(t, v); !bytes.Equal(b, b2) {
		t.Fatalf("encoding is not a fixed point:\n%s\n%s", b, b2)
	}
}

func checkRun(t *testing.T, r Run) {
	t.Helper()
	checkRunID(t, r.RunID)
	checkName(t, r.Workflow)
	if !ValidStatus(r.Status) {
		t.Fatalf("unknown status %q accepted", r.Status)
	}
	checkJSON(t, "input", r.Input)
	checkJSON(t, "output", r.Output)
}

func checkTask(t *testing.T, task Task) {
	t.Helper()
	checkRunID(t, task.RunID)
	checkName(t, task.Workflow)
	if len(task.Input) == 0 || !json.Valid(task.Input) {
		t.Fatalf("task with missing or invalid input %q accepted", task.Input)
	}
	if task.StepID == "" {
		if task.Token == "" {
			t.Fatal("start task without token accepted")
		}
		return
	}
	checkStepID(t, task.RunID, task.StepID)
}

func checkStep(t *testing.T, s Step) {
	t.Helper()
	checkRunID(t, s.RunID)
	checkName(t, s.Name)
	if name := checkStepID(t, s.RunID, s.StepID); name != s.Name {
		t.Fatalf("step ID %q accepted for step %q", s.StepID, s.Name)
	}
	if s.Seq < 0 || s.Attempt < 0 {
		t.Fatalf("negative seq %d or attempt %d accepted", s.Seq, s.Attempt)
	}
	checkJSON(t, "output", s.Output)
}

// checkRunID restates the run ID rule without calling the validator.
func checkRunID(t *testing.T, id string) {
	t.Helper()
	if !tokenOK(id, MaxRunIDLen, "=") {
		t.Fatalf("invalid run ID %q accepted", id)
	}
}

func checkName(t *testing.T, name string) {
	t.Helper()
	if !tokenOK(name, MaxNameLen, "") {
		t.Fatalf("invalid name %q accepted", name)
	}
}

func tokenOK(s string, maxLen int, extra string) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
	for _, c := range []byte(s) {
		if !strings.ContainsRune(alphabet+extra, rune(c)) {
			return false
		}
	}
	return true
}

// checkStepID checks that id is StepID(runID, name, n) for a valid name and
// n >= 0, and returns name.
func checkStepID(t *testing.T, runID, id string) string {
	t.Helper()
	parts := strings.Split(id, ".")
	if len(parts) != 3 || parts[0] != runID {
		t.Fatalf("step ID %q of run %q accepted", id, runID)
	}
	checkName(t, parts[1])
	n, err := strconv.Atoi(parts[2])
	if err != nil || n < 0 || StepID(runID, parts[1], n) != id {
		t.Fatalf("step ID %q with a bad occurrence accepted", id)
	}
	return parts[1]
}

func checkJSON(t *testing.T, what string, raw json.RawMessage) {
	t.Helper()
	if len(raw) > 0 && !json.Valid(raw) {
		t.Fatalf("invalid JSON %s %q accepted", what, raw)
	}
}

// sameRaw reports whether b is a's encoding: a compacted, which also means
// it is never longer. A missing payload of a field without omitempty comes
// back as null.
func sameRaw(a, b json.RawMessage, nullIfEmpty bool) bool {
	if len(a) == 0 {
		if nullIfEmpty {
			return string(b) == "null"
		}
		return len(b) == 0
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, a); err != nil {
		return false
	}
	return bytes.Equal(buf.Bytes(), b) && len(b) <= len(a)
}

// sameTime compares instants and, for a set time, the zone offset that the
// encoding keeps. A zero time is omitted by omitzero fields and comes back
// in UTC.
func sameTime(a, b time.Time) bool {
	if !a.Equal(b) {
		return false
	}
	if a.IsZero() {
		return true
	}
	_, oa := a.Zone()
	_, ob := b.Zone()
	return oa == ob
}

func sameError(a, b *ErrorInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameRun(a, b Run) bool {
	return a.V == b.V && a.RunID == b.RunID && a.Workflow == b.Workflow && a.Status == b.Status &&
		a.Token == b.Token && a.Source == b.Source &&
		sameRaw(a.Input, b.Input, true) && sameRaw(a.Output, b.Output, false) &&
		sameTime(a.CreatedAt, b.CreatedAt) && sameTime(a.UpdatedAt, b.UpdatedAt) && sameError(a.Error, b.Error)
}

func sameTask(a, b Task) bool {
	return a.V == b.V && a.RunID == b.RunID && a.Workflow == b.Workflow && a.StepID == b.StepID &&
		a.Token == b.Token && a.Source == b.Source && a.Rev == b.Rev &&
		sameRaw(a.Input, b.Input, true) && sameTime(a.CreatedAt, b.CreatedAt)
}

func sameStep(a, b Step) bool {
	return a.V == b.V && a.StepID == b.StepID && a.RunID == b.RunID && a.Name == b.Name &&
		a.Seq == b.Seq && a.Attempt == b.Attempt && a.Worker == b.Worker &&
		sameRaw(a.Output, b.Output, false) && sameError(a.Error, b.Error) && sameTime(a.Committed, b.Committed)
}
