package jetflowtype

// RunStatus is a run's lifecycle state. A run is created running;
// completed, failed and cancelled are final and never change again. It is
// stored in run records and encoded in JSON as its string.
type RunStatus string

// Run states; all but running are final.
const (
	StatusRunning   RunStatus = "running"
	StatusCompleted RunStatus = "completed"
	StatusFailed    RunStatus = "failed"
	StatusCancelled RunStatus = "cancelled"
)

// Terminal reports whether s is final.
func (s RunStatus) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}
