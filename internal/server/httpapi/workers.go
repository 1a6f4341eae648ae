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

// engine is GET /v1/engine: the engine protocols of the workers running now
// and the runs under way by build (jetflow.EngineStatus). It reads every
// kept run record, so it is asked for, not polled.
func (s *Server) engine(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.requestContext(r)
	defer cancel()
	st, err := s.cfg.Backend.EngineStatus(ctx)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", st)
}
