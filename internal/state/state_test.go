package state

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/jetflowtype"
)

func TestValidateRunID(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"stripe-evt_123", "order-42", "a", "b64==", strings.Repeat("x", MaxRunIDLen)} {
		require.NoError(t, ValidateRunID(ok), ok)
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "a*", "a>", "é", strings.Repeat("x", MaxRunIDLen+1)} {
		err := ValidateRunID(bad)
		require.ErrorIs(t, err, ErrInvalidRunID, bad)
	}
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	require.NoError(t, ValidateName("send-confirmation_2"))
	for _, bad := range []string{"", "a.b", "a=b", "x y", strings.Repeat("n", MaxNameLen+1)} {
		require.ErrorIs(t, ValidateName(bad), ErrInvalidName, bad)
	}
}

func TestStepIDIsAPureFunctionOfRunNameOccurrence(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order-42.charge.0", StepID("order-42", "charge", 0))
	require.Equal(t, "order-42.charge.1", StepID("order-42", "charge", 1))
	require.NotEqual(t, StepID("r", "a", 1), StepID("r", "a", 0))
}

func TestDecodeRejectsMalformedRecords(t *testing.T) {
	t.Parallel()
	for _, b := range []string{``, `{`, `[]`, `{"run_id":"a b","workflow":"w","status":"running"}`,
		`{"run_id":"r","workflow":"w","status":"sleeping"}`, `{"run_id":"r","workflow":"","status":"running"}`} {
		_, err := DecodeRun([]byte(b))
		require.ErrorIs(t, err, ErrCorrupt, b)
	}
	for _, b := range []string{`{}`, `{"run_id":"r","workflow":"w","input":1}`, `{"run_id":"r","workflow":"w","token":"t","input":{`} {
		_, err := DecodeTask([]byte(b))
		require.ErrorIs(t, err, ErrCorrupt, b)
	}
	_, err := DecodeStep([]byte(`{"step_id":"x"}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeAudit([]byte(`{"duplicates":-1}`))
	require.ErrorIs(t, err, ErrCorrupt)

	run, err := DecodeRun([]byte(`{"v":1,"run_id":"r","workflow":"w","status":"completed","input":1}`))
	require.NoError(t, err)
	require.True(t, run.Status.Terminal())
}

// A step task carries every stored field of a running run: the run's final
// write starts from RunFromTask and must lose none of them (after_expiry,
// source, retention, fingerprint, generation, created_at...). A field added
// to Run fails this test until StepTask and RunFromTask carry it.
func TestStepTaskCarriesEveryRunField(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	run := Run{
		V: Version, RunID: "order-42", Workflow: "orders", Input: json.RawMessage(`{"n":1}`),
		Status: StatusRunning, Token: "tok", Fingerprint: "fp", Generation: 7, Retention: time.Hour,
		AfterExpiry: true, Source: "svc", CreatedAt: created, UpdatedAt: created,
		Output: json.RawMessage(`1`), Error: &ErrorInfo{Message: "x"},
		Parent:       &ParentLink{RunID: "p", Workflow: "pw", Token: "pt", StepID: "p.child.0"},
		Children:     []ChildLink{{RunID: "order-42=ship=0", Workflow: "ship", StepID: "order-42/7.ship.0"}},
		TraceParent:  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Attributes:   map[string]string{"order_id": "42"},
		Predecessors: []Predecessor{{Generation: 6, Token: "tok6", Status: StatusCancelled}},
		Exec:         ExecLease,
		Adopted:      true,
		Block:        &jetflowtype.RunBlock{Reason: jetflowtype.BlockDivergence},
		Waived:       []string{"order-42/7.a.0"},
		WaivedRev:    map[string]uint64{"order-42/7.a.0": 3},
		Build:        "0123456789ab",
		Rerun:        &RerunLink{RunID: "order-41", From: "order-41.ship.0", Before: 2, Records: 2},
	}
	// Fields a running run does not have yet, or that its finish rewrites.
	// Children and predecessors are not carried (they can be many): the
	// finish of a run with either reads the record again before it writes.
	rewritten := map[string]bool{"Status": true, "UpdatedAt": true, "Output": true, "Error": true, "Children": true, "Predecessors": true,
		"Block": true, "Waived": true, "WaivedRev": true}
	v := reflect.ValueOf(run)
	for i := range v.NumField() {
		require.False(t, v.Field(i).IsZero(), "set Run.%s in this test", v.Type().Field(i).Name)
	}
	task := StepTask(run, 9, "order-42/7.a.0")
	require.Zero(t, task.Rev, "a run with children: the finish must read the record")
	withoutChildren := run
	withoutChildren.Children = nil
	require.Zero(t, StepTask(withoutChildren, 9, "order-42/7.a.0").Rev, "a run with predecessors: the finish must read the record")
	withoutChildren.Predecessors = nil
	require.Zero(t, StepTask(withoutChildren, 9, "order-42/7.a.0").Rev, "a blocked run: the finish must read the record")
	withoutChildren.Block, withoutChildren.Waived, withoutChildren.WaivedRev = nil, nil, nil
	require.Equal(t, uint64(9), StepTask(withoutChildren, 9, "order-42/7.a.0").Rev)
	b, err := Encode(task)
	require.NoError(t, err)
	decoded, err := DecodeTask(b)
	require.NoError(t, err)
	got := reflect.ValueOf(RunFromTask(decoded))
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if rewritten[name] {
			continue
		}
		require.Equal(t, v.Field(i).Interface(), got.Field(i).Interface(), "Run.%s lost through a step task", name)
	}
}

// A generation's successor lists it after its own predecessors, keeps the
// newest MaxPredecessors, and never shares the list it came from; MadeBy
// finds a token in the run or among its predecessors, with the status that
// generation ended in.
func TestSuccessorsKeepTheNewestGenerations(t *testing.T) {
	t.Parallel()
	run := Run{Generation: 0, Token: "t0", Status: StatusCancelled}
	for g := 1; g <= MaxPredecessors+5; g++ {
		next := Run{Generation: g, Token: fmt.Sprintf("t%d", g), Status: StatusCancelled, Predecessors: run.Successors()}
		require.Len(t, next.Predecessors, min(g, MaxPredecessors))
		require.Equal(t, Predecessor{Generation: g - 1, Token: fmt.Sprintf("t%d", g-1), Status: StatusCancelled}, next.Predecessors[len(next.Predecessors)-1])
		run = next
	}
	require.Equal(t, 5, run.Predecessors[0].Generation, "the oldest dropped")

	shared := Run{Generation: 1, Token: "a", Status: StatusCompleted, Predecessors: make([]Predecessor, 1, 8)}
	x, y := shared.Successors(), shared.Successors()
	x[1].Token = "changed"
	require.Equal(t, "a", y[1].Token, "successor lists share no array")

	run.Status = StatusRunning
	gen, status, ok := run.MadeBy(run.Token)
	require.True(t, ok)
	require.Equal(t, run.Generation, gen)
	require.Equal(t, StatusRunning, status)
	gen, status, ok = run.MadeBy("t20")
	require.True(t, ok)
	require.Equal(t, 20, gen)
	require.Equal(t, StatusCancelled, status)
	_, _, ok = run.MadeBy("t4")
	require.False(t, ok, "beyond the bound")
	_, _, ok = run.MadeBy("")
	require.False(t, ok)
}
