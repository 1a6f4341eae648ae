package httpapi

import (
	"fmt"
	"net/http"

	"github.com/jetflow/jetflow"
)

// KeyReset is the body of a task key reset.
type KeyReset struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
	// Workflow or RunID is the scope's ID (scope workflow or run).
	Workflow string `json:"workflow,omitempty"`
	RunID    string `json:"run_id,omitempty"`
	// Deleted is how many step entries the reset removed: 0 when the key
	// was not set, had expired, or was reset already.
	Deleted int `json:"deleted"`
}

// resetKey is DELETE /v1/task-keys/{key}?scope=... (and its deprecated
// alias DELETE /v1/idempotency-keys/{key}): it forgets a task idempotency
// key so that the next step call with it runs again.
func (s *Server) resetKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q, err := strictQuery(r)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	out := KeyReset{Key: key, Scope: q.Get("scope"), Workflow: q.Get("workflow"), RunID: q.Get("run_id")}
	scope, scopeID, err := keyScope(out)
	if err != nil {
		s.fail(w, r, out.RunID, err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	n, err := s.cfg.Backend.ResetTaskKey(ctx, key, scope, scopeID)
	if err != nil {
		s.fail(w, r, out.RunID, err)
		return
	}
	out.Deleted = n
	writeJSON(w, http.StatusOK, "application/json", out)
}

// keyScope reads the scope of a reset: scope is required, and exactly the
// parameter naming its ID (workflow for workflow, run_id for run, none for
// global) must be given, so that a reset never silently misses its key.
func keyScope(k KeyReset) (jetflow.KeyScope, string, error) {
	switch k.Scope {
	case "global":
		if k.Workflow != "" || k.RunID != "" {
			return 0, "", fmt.Errorf("%w: scope=global takes neither workflow nor run_id", errBadRequest)
		}
		return jetflow.ScopeGlobal, "", nil
	case "workflow":
		if k.Workflow == "" || k.RunID != "" {
			return 0, "", fmt.Errorf("%w: scope=workflow needs workflow=<name> and no run_id", errBadRequest)
		}
		return jetflow.ScopeWorkflow, k.Workflow, nil
	case "run":
		if k.RunID == "" || k.Workflow != "" {
			return 0, "", fmt.Errorf("%w: scope=run needs run_id=<run ID> and no workflow", errBadRequest)
		}
		return jetflow.ScopeRun, k.RunID, nil
	default:
		return 0, "", fmt.Errorf("%w: scope %q: want global, workflow or run", errBadRequest, clip(k.Scope))
	}
}
