package metrics

// Entry is the way a start reached jetflow, the entry label of
// jetflow_starts_total.
type Entry string

// Entry points.
const (
	EntrySDK     Entry = "sdk"
	EntryNATS    Entry = "nats"
	EntryHTTP    Entry = "http"
	EntryWebhook Entry = "webhook"
	// EntryChild: a workflow started the run as its child.
	EntryChild Entry = "child"
)

// Outcomes of an event delivery (Metrics.Event).
const (
	EventDelivered = "delivered"
	EventDuplicate = "duplicate"
	EventRefused   = "refused"
	EventError     = "error"
)

// Layer is the deduplication layer that stopped a duplicate, the layer
// label of jetflow_duplicates_suppressed_total.
type Layer string

// Deduplication layers, from the outermost.
const (
	LayerBroker  Layer = "broker"   // JetStream's Nats-Msg-Id window (no longer counted: a duplicate start publishes nothing)
	LayerKV      Layer = "kv"       // the run record's create-once key
	LayerTaskKey Layer = "task_key" // a task key already claimed
	LayerEvent   Layer = "event"    // an event ID already delivered
)

// StepResult is how a step attempt ended, the result label of
// jetflow_steps_total.
type StepResult string

// Step results.
const (
	StepCommitted StepResult = "committed" // output stored
	StepRetried   StepResult = "retried"   // failed, another attempt scheduled
	StepFailed    StepResult = "failed"    // failed, no attempts left
	StepFatal     StepResult = "fatal"     // failed with an error that is never retried
)

// Start outcomes, the outcome label of jetflow_starts_total.
const (
	OutcomeCreated   = "created"
	OutcomeExisting  = "existing"
	OutcomeRestarted = "restarted"
	// OutcomeSuperseded: the start cancelled the running generation and
	// started a new one (conflict policy Supersede).
	OutcomeSuperseded = "superseded"
	OutcomeConflict   = "conflict"
	OutcomeRejected   = "rejected"
	// OutcomeInvalid: the start was refused for the caller's mistake, the
	// same answer whenever it is sent again: a malformed envelope, an
	// invalid or missing run ID, an input the workflow refuses or one over
	// the size limit, an invalid conflict policy or attributes.
	OutcomeInvalid = "invalid"
	// OutcomeError: the engine could not decide (NATS unreachable, slow or
	// refusing, a deployment setting the start cannot meet); the caller
	// may retry. The JetflowStartErrors alert counts only these.
	OutcomeError = "error"
)

// other replaces any label value outside its fixed list; stateNone is the
// state of a start whose run state is unknown.
const (
	other     = "other"
	stateNone = "none"
)

// Allowed values of the labels with fixed lists.
var (
	entries = set(string(EntrySDK), string(EntryNATS), string(EntryHTTP), string(EntryWebhook), string(EntryChild))
	layers  = set(string(LayerBroker), string(LayerKV), string(LayerTaskKey), string(LayerEvent))
	// eventOutcomes are the outcomes of an event delivery (Event).
	eventOutcomes = set(EventDelivered, EventDuplicate, EventRefused, EventError)
	stepResults   = set(string(StepCommitted), string(StepRetried), string(StepFailed), string(StepFatal))
	outcomes      = set(OutcomeCreated, OutcomeExisting, OutcomeRestarted, OutcomeSuperseded, OutcomeConflict, OutcomeRejected, OutcomeInvalid, OutcomeError)
	finalStates   = set("completed", "failed", "cancelled")
	startStates   = set("running", "completed", "failed", "cancelled", stateNone)
)

func set(values ...string) map[string]struct{} {
	s := make(map[string]struct{}, len(values))
	for _, v := range values {
		s[v] = struct{}{}
	}
	return s
}

// bounded returns v when it is in allowed, "other" otherwise.
func bounded(v string, allowed map[string]struct{}) string {
	if _, ok := allowed[v]; ok {
		return v
	}
	return other
}
