// Package otlptest is an OTLP/HTTP receiver for tests: it records every
// request it gets and answers 200, as a collector does.
package otlptest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Request is one request the receiver got.
type Request struct {
	Method, Path, ContentType string
	Body                      []byte
}

// Collector is a running receiver; URL is its base URL (the value of
// OTEL_EXPORTER_OTLP_ENDPOINT).
type Collector struct {
	URL string
	mu  sync.Mutex
	got []Request
}

// New starts a receiver, closed when t ends.
func New(t testing.TB) *Collector {
	c := &Collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.got = append(c.got, Request{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Body: body})
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// Traces returns the requests received on /v1/traces with a protobuf body
// that is not empty.
func (c *Collector) Traces() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Request
	for _, r := range c.got {
		if r.Method == http.MethodPost && r.Path == "/v1/traces" && r.ContentType == "application/x-protobuf" && len(r.Body) > 0 {
			out = append(out, r)
		}
	}
	return out
}
