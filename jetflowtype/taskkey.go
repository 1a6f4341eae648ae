package jetflowtype

import "fmt"

// KeyScope says who shares a task key.
type KeyScope int

const (
	// ScopeRun (the default): the key is private to the run; a run started
	// again under the same run ID (StartNew, or a start after the
	// retention) is another run and does not share it.
	ScopeRun KeyScope = iota
	// ScopeWorkflow: the key is shared by every run of the workflow.
	ScopeWorkflow
	// ScopeGlobal: the key is shared by every run of every workflow.
	ScopeGlobal
)

// String is the scope's name: "run", "workflow" or "global"; a value
// outside the constants prints as KeyScope(<n>).
func (s KeyScope) String() string {
	switch s {
	case ScopeRun:
		return "run"
	case ScopeWorkflow:
		return "workflow"
	case ScopeGlobal:
		return "global"
	default:
		return fmt.Sprintf("KeyScope(%d)", int(s))
	}
}
