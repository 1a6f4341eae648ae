package opshttp

import (
	"net/http"
	"time"

	"github.com/jetflow/jetflow/internal/metrics"
)

// Instrument wraps mux so every request it serves is counted in m's HTTP
// metrics under the pattern mux matched (http.Request.Pattern; requests
// that match no pattern count under route "other") and the status code
// written (200 when the handler writes none). mux must be the
// *http.ServeMux itself, or a handler passing the same *http.Request on to
// it, since the mux records the pattern on that request. With a nil m it
// returns mux unchanged.
func Instrument(m *metrics.Metrics, mux http.Handler) http.Handler {
	if m == nil {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		mux.ServeHTTP(sw, r)
		m.HTTP(r.Pattern, sw.status(), time.Since(start))
	})
}

// statusWriter remembers the first status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= http.StatusOK {
		w.code = code // 1xx informational headers are not the final status
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes flushes through for streaming handlers.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.code == 0 {
			w.code = http.StatusOK
		}
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}
