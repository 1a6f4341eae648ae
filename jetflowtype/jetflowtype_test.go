package jetflowtype

import "testing"

// The zero values are the defaults: attach while running, return once
// ended, strict fingerprints, the run scope.
func TestZeroValuesAreTheDefaults(t *testing.T) {
	t.Parallel()
	want := ConflictPolicy{WhileRunning: Attach, AfterCompleted: ReturnExisting, AfterFailed: ReturnExisting}
	if (ConflictPolicy{}) != want {
		t.Errorf("zero ConflictPolicy is %+v, want %+v", ConflictPolicy{}, want)
	}
	var m FingerprintMode
	if m != FingerprintStrict {
		t.Errorf("zero FingerprintMode is %d", m)
	}
	var s KeyScope
	if s != ScopeRun {
		t.Errorf("zero KeyScope is %d", s)
	}
}

// A scope prints as its name; an unknown one as its number, never as
// another scope's name.
func TestKeyScopeString(t *testing.T) {
	t.Parallel()
	for s, want := range map[KeyScope]string{
		ScopeRun: "run", ScopeWorkflow: "workflow", ScopeGlobal: "global",
		-1: "KeyScope(-1)", 3: "KeyScope(3)", 9: "KeyScope(9)",
	} {
		if got := s.String(); got != want {
			t.Errorf("KeyScope(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}
