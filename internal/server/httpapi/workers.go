package httpapi

import (
	"net/http"
)

// workers is GET /v1/workers: who serves what now (jetflow.Roster), the
// workers running and the workflows the deployment knows.
func (s *Server) workers(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.requestContext(r)
	defer cancel()
	roster, err := s.cfg.Backend.Roster(ctx)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", roster)
}
