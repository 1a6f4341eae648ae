package jetflow

import (
	"fmt"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/state"
)

// enumPair is one public enum value and the internal value it stands for.
type enumPair[P, I comparable] struct {
	pub P
	in  I
}

// enumTable converts an enum between the public vocabulary and an internal
// one by listing every pair: no conversion depends on the order or the
// numbering of either side's constants, and a value outside the table is an
// error, never a default. convert_test.go checks both directions of every
// table.
type enumTable[P, I comparable] struct {
	name  string // the public type, for errors
	err   error  // the sentinel an unknown value matches
	pairs []enumPair[P, I]
}

// toInternal returns the internal value of p.
func (t enumTable[P, I]) toInternal(p P) (I, error) {
	for _, e := range t.pairs {
		if e.pub == p {
			return e.in, nil
		}
	}
	var zero I
	return zero, fmt.Errorf("%w: %s(%#v)", t.err, t.name, p) // %#v: not String, which may call toInternal
}

// fromInternal returns the public value of i.
func (t enumTable[P, I]) fromInternal(i I) (P, error) {
	for _, e := range t.pairs {
		if e.in == i {
			return e.pub, nil
		}
	}
	var zero P
	return zero, fmt.Errorf("%w: internal %s(%#v)", t.err, t.name, i)
}

var (
	whileRunningTable = enumTable[WhileRunning, dedupe.OnRunning]{
		name: "WhileRunning", err: ErrInvalidConflictPolicy,
		pairs: []enumPair[WhileRunning, dedupe.OnRunning]{
			{Attach, dedupe.Attach},
			{RejectWhileRunning, dedupe.RejectRunning},
			{Supersede, dedupe.Supersede},
		},
	}
	afterEndedTable = enumTable[AfterEnded, dedupe.OnEnded]{
		name: "AfterEnded", err: ErrInvalidConflictPolicy,
		pairs: []enumPair[AfterEnded, dedupe.OnEnded]{
			{ReturnExisting, dedupe.Return},
			{RejectAfterEnd, dedupe.RejectEnded},
			{StartNew, dedupe.StartNew},
		},
	}
	// fingerprintModeTable: the admitter's form is "ignore the input".
	fingerprintModeTable = enumTable[FingerprintMode, bool]{
		name: "FingerprintMode", err: ErrInvalidConflictPolicy,
		pairs: []enumPair[FingerprintMode, bool]{
			{FingerprintStrict, false},
			{FingerprintIgnore, true},
		},
	}
	keyScopeTable = enumTable[KeyScope, state.KeyScope]{
		name: "KeyScope", err: ErrInvalidKey,
		pairs: []enumPair[KeyScope, state.KeyScope]{
			{ScopeRun, state.ScopeRun},
			{ScopeWorkflow, state.ScopeWorkflow},
			{ScopeGlobal, state.ScopeGlobal},
		},
	}
)

func (w WhileRunning) toInternal() (dedupe.OnRunning, error) { return whileRunningTable.toInternal(w) }
func whileRunningFrom(r dedupe.OnRunning) (WhileRunning, error) {
	return whileRunningTable.fromInternal(r)
}

func (a AfterEnded) toInternal() (dedupe.OnEnded, error)  { return afterEndedTable.toInternal(a) }
func afterEndedFrom(e dedupe.OnEnded) (AfterEnded, error) { return afterEndedTable.fromInternal(e) }
func (s KeyScope) toInternal() (state.KeyScope, error)    { return keyScopeTable.toInternal(s) }
func keyScopeFrom(s state.KeyScope) (KeyScope, error)     { return keyScopeTable.fromInternal(s) }
func (m FingerprintMode) toInternal() (ignoreInput bool, err error) {
	return fingerprintModeTable.toInternal(m)
}

// fingerprintModeFrom is the public form of the admitter's setting (every
// bool has one).
func fingerprintModeFrom(ignoreInput bool) FingerprintMode {
	m, _ := fingerprintModeTable.fromInternal(ignoreInput)
	return m
}

// String is the scope's name: "run", "workflow" or "global".
func (s KeyScope) String() string {
	in, err := s.toInternal()
	if err != nil {
		return fmt.Sprintf("KeyScope(%d)", int(s))
	}
	return in.String()
}
