package jetflowtype

// RunStatus is a run's lifecycle state. A run is created running;
// completed, failed and cancelled are final and never change again. A
// running run is blocked while no code it may run goes on: its body
// diverged from its history (RunBlock says where), and it goes on when
// compatible code takes it or an operator resumes it. It is stored in run
// records and encoded in JSON as its string.
type RunStatus string

// Run states; all but running and blocked are final.
const (
	StatusRunning   RunStatus = "running"
	StatusBlocked   RunStatus = "blocked"
	StatusCompleted RunStatus = "completed"
	StatusFailed    RunStatus = "failed"
	StatusCancelled RunStatus = "cancelled"
)

// Terminal reports whether s is final.
func (s RunStatus) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Active reports whether a run in state s has not ended: running or
// blocked. Everything that holds for a run that has not ended (its record
// never expires, a duplicate start finds it "running" for the conflict
// policy, it can be cancelled) holds for both.
func (s RunStatus) Active() bool { return s == StatusRunning || s == StatusBlocked }
