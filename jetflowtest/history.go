package jetflowtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jetflow/jetflow"
)

// HistoryFormat is the format of a History file: the value of its
// "format" field. A file of another format is refused (ErrInvalidHistory).
const HistoryFormat = "jetflow-history/1"

// ErrInvalidHistory: a history that cannot be replayed (not JSON, another
// format, a step that is not the run's, two steps with one ID or one
// place). Nothing is read from a history refused with it.
var ErrInvalidHistory = errors.New("jetflowtest: invalid history")

// History is what the replay check replays: a run's workflow, ID,
// generation and input, and its committed steps in the order the body
// started them. Take it from a run (Env.History, HistoryOf) and keep it as
// a golden file (WriteHistory, ReadHistory).
//
// Its JSON form is the file format, HistoryFormat:
//
//	{
//	  "format": "jetflow-history/1",
//	  "workflow": "order", "run_id": "o-1", "generation": 0,
//	  "status": "completed", "input": {...},
//	  "steps": [
//	    {"seq": 0, "step_id": "o-1.reserve.0", "name": "reserve", "output": ..., "committed_at": "..."},
//	    {"seq": 1, "step_id": "o-1.nap.0", "name": "nap", "kind": "sleep", ...},
//	    {"seq": -1, "step_id": "o-1.event=paid.0", "name": "event=paid", "kind": "event", "event_id": "e-1", ...}
//	  ]
//	}
//
// "seq" is the step's place in the order the body started steps; -1 for
// an event or hook wait that an event ended, whose record does not say
// (it is matched by step ID only). "kind" is "sleep", "event" or "hook"
// for a wait, empty for a step that ran a function or a child ("child"
// holds the child's run ID). "error", "fatal" and "code" hold a committed
// failure. "committed_at" orders the commits (AwaitFirst's winner).
type History struct {
	Format     string            `json:"format"`
	Workflow   string            `json:"workflow"`
	RunID      string            `json:"run_id"`
	Generation int               `json:"generation,omitempty"`
	Status     jetflow.RunStatus `json:"status,omitempty"`
	Input      json.RawMessage   `json:"input"`
	// Ranked: "seq" counts only the steps with a place (a history read
	// from a run's JSON, which does not carry the places): the waits that
	// an event ended are left out of the count, and a place whose step was
	// not committed yet is not known.
	Ranked bool          `json:"ranked,omitempty"`
	Steps  []HistoryStep `json:"steps"`
}

// HistoryStep is one committed step of a History.
type HistoryStep struct {
	Seq         int             `json:"seq"`
	StepID      string          `json:"step_id"`
	Name        string          `json:"name"`
	Kind        string          `json:"kind,omitempty"`
	Child       string          `json:"child,omitempty"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       string          `json:"error,omitempty"`
	Fatal       bool            `json:"fatal,omitempty"`
	Code        string          `json:"code,omitempty"`
	EventID     string          `json:"event_id,omitempty"`
	CommittedAt time.Time       `json:"committed_at"`
}

// ordered reports whether s's place in the history is known: every step
// but a wait that an event ended (its sender did not know the place).
func (s HistoryStep) ordered() bool { return s.Seq >= 0 }

// History returns run runID's History as stored now. A read that could
// not be made fails the test at once.
func (e *Env) History(runID string) History {
	e.t.Helper()
	return e.Inspect(runID).History()
}

// History is the Report's run as a History.
func (r Report) History() History {
	return HistoryOf(r.Run, r.Steps, func(i int) int { return r.Steps[i].Seq })
}

// HistoryOf builds the History of run from its committed steps; seq gives
// the place of steps[i] (StepRecord.Seq; a list read from JSON does not
// carry it). A wait that an event ended gets -1.
func HistoryOf(run jetflow.Run, steps []jetflow.StepRecord, seq func(i int) int) History {
	h := History{Format: HistoryFormat, Workflow: run.Workflow, RunID: run.RunID, Generation: run.Generation,
		Status: run.Status, Input: run.Input, Steps: make([]HistoryStep, 0, len(steps))}
	for i, s := range steps {
		hs := HistoryStep{Seq: seq(i), StepID: s.StepID, Name: s.Name, Kind: s.Kind, Child: s.Child,
			Output: s.Output, Error: s.Error, Fatal: s.Fatal, EventID: s.EventID, CommittedAt: s.CommittedAt}
		if s.EventID != "" {
			hs.Seq = -1
		}
		h.Steps = append(h.Steps, hs)
	}
	sort.SliceStable(h.Steps, func(i, j int) bool { return h.Steps[i].Seq < h.Steps[j].Seq })
	return h
}

// WriteHistory writes h to the file path in HistoryFormat, indented, with
// a final newline: the same History gives the same bytes.
func WriteHistory(path string, h History) error {
	if h.Format == "" {
		h.Format = HistoryFormat
	}
	if err := h.validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("jetflowtest: encode history of %s: %w", h.RunID, err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadHistory reads a History from the file path: a file WriteHistory
// wrote, or the JSON of a run with its steps (the body of the HTTP API's
// GET /v1/runs/{id}, or producer get --output json), whose steps are
// taken in the order listed, without gaps (places of steps not committed
// yet are not in that JSON). A file that is neither, or
// whose steps are not the run's, is ErrInvalidHistory.
func ReadHistory(path string) (History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return History{}, err
	}
	return ParseHistory(b)
}

// ParseHistory is ReadHistory of the bytes b.
func ParseHistory(b []byte) (History, error) {
	var probe struct {
		Format *string `json:"format"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return History{}, fmt.Errorf("%w: %w", ErrInvalidHistory, err)
	}
	var h History
	if probe.Format == nil {
		var body struct {
			jetflow.Run
			Steps []jetflow.StepRecord `json:"steps"`
		}
		if err := strictJSON(b, &body); err != nil {
			return History{}, err
		}
		// The list is in the order of places; a wait an event ended has
		// none of its own.
		seqs, next := make([]int, len(body.Steps)), 0
		for i, st := range body.Steps {
			if st.EventID == "" {
				seqs[i], next = next, next+1
			}
		}
		h = HistoryOf(body.Run, body.Steps, func(i int) int { return seqs[i] })
		h.Ranked = true
	} else if err := strictJSON(b, &h); err != nil {
		return History{}, err
	}
	if err := h.validate(); err != nil {
		return History{}, err
	}
	return h, nil
}

// strictJSON decodes b into v; a run body carries more fields than a
// History reads, so unknown fields are allowed, but trailing data is not.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidHistory, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: data after the history", ErrInvalidHistory)
	}
	return nil
}

// validate checks that h can be replayed.
func (h History) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidHistory, fmt.Sprintf(format, args...))
	}
	switch {
	case h.Format != HistoryFormat:
		return bad("format %q, want %q", h.Format, HistoryFormat)
	case h.Workflow == "":
		return bad("no workflow name")
	case h.RunID == "":
		return bad("no run ID")
	case h.Generation < 0:
		return bad("negative generation %d", h.Generation)
	case len(h.Input) > 0 && !json.Valid(h.Input):
		return bad("input is not JSON")
	}
	prefix := h.RunID + "."
	if h.Generation > 0 {
		prefix = fmt.Sprintf("%s/%d.", h.RunID, h.Generation)
	}
	ids, seqs := map[string]bool{}, map[int]string{}
	for _, s := range h.Steps {
		if !strings.HasPrefix(s.StepID, prefix+s.Name+".") {
			return bad("step %q is not a step %q of run %s", s.StepID, s.Name, prefix[:len(prefix)-1])
		}
		if ids[s.StepID] {
			return bad("step %s listed twice", s.StepID)
		}
		ids[s.StepID] = true
		if s.Seq < -1 {
			return bad("step %s at place %d", s.StepID, s.Seq)
		}
		if other, ok := seqs[s.Seq]; ok && s.ordered() {
			return bad("steps %s and %s both at place %d", other, s.StepID, s.Seq)
		}
		if s.ordered() {
			seqs[s.Seq] = s.StepID
		}
		if len(s.Output) > 0 && !json.Valid(s.Output) {
			return bad("output of step %s is not JSON", s.StepID)
		}
	}
	return nil
}
