package httpapi

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openapiYAML is the API's OpenAPI 3.1 document.
//
//go:embed openapi.yaml
var openapiYAML []byte

// openapi is GET /v1/openapi.yaml.
func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(openapiYAML)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openapiYAML) // the client went away: nothing to do
}
