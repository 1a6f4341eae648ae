package startproto

import (
	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/jetflowtype"
)

// DecodeStartRequest parses and validates a request-reply envelope, as
// Serve does for a workflow that does not require a run ID: the run ID is
// run_id, generated only when the envelope says generate_run_id; the policy
// defaults to base where the envelope leaves it out.
func DecodeStartRequest(workflow string, b []byte, base jetflowtype.ConflictPolicy) (dedupe.Request, error) {
	sr, err := parseStartRequest(b)
	if err != nil {
		return dedupe.Request{}, err
	}
	if err := sr.resolveRunID(workflow, false); err != nil {
		return dedupe.Request{}, err
	}
	return sr.request(workflow, base)
}
