package jetflowtype

// StepDetails describes the running step attempt.
type StepDetails struct {
	// StepID is deterministic: run ID, step name and occurrence
	// (run-42.charge.0). Pass it as the Idempotency-Key of external calls.
	StepID string
	// StepName is the name the workflow called the step with.
	StepName string
	// Attempt counts from 1; a redelivery after a crash is a new attempt.
	Attempt int
	// RunID is the run's ID.
	RunID string
	// Workflow is the workflow's stable name.
	Workflow string
}
