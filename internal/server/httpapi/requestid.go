package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/logging"
)

// HeaderRequestID carries a request's ID: the client's when it sent a
// usable one, else one the server made; every answer echoes it.
const HeaderRequestID = "X-Request-Id"

// maxRequestIDLen bounds a client's request ID; a longer one is replaced.
const maxRequestIDLen = 128

type requestIDKey struct{}

// RequestID is the request ID RequestLog gave ctx's request, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// RequestLog wraps h so that every request has a request ID and one access
// log line:
//
//   - the ID is the client's X-Request-Id when it is usable (1 to 128
//     printable ASCII characters, no spaces), else 16 random hex digits;
//     the answer carries it in X-Request-Id and the request's context in
//     RequestID (the API's failure logs name it);
//   - once h has answered, log gets, at info level, "request" with
//     request_id, method, route (the pattern of the handler that answered,
//     r.Pattern), path, status (499: the client went away first) and
//     took (logging.Duration), plus the run's workflow and run_id when the
//     request names them (the path, or the Idempotency-Key of a start),
//     and an event's name (event) and ID (event_id, its Idempotency-Key).
//
// It never logs query strings, headers other than those named, or bodies:
// tokens and payloads stay out of the log.
func RequestLog(h http.Handler, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		begin := time.Now()
		id := r.Header.Get(HeaderRequestID)
		if !usableRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		rec := &recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)

		ev := log.Info().Str("request_id", id).Str("method", r.Method).Str("route", r.Pattern).
			Str("path", r.URL.Path).Int("status", rec.status()).Str("took", logging.Duration(time.Since(begin)))
		runID := r.PathValue("id")
		switch r.Pattern {
		case patternStart:
			ev = ev.Str("workflow", r.PathValue("name"))
			if runID == "" {
				runID = r.Header.Get(HeaderIdempotencyKey)
			}
		case patternSendEvent, patternResumeHook:
			if name := r.PathValue("name"); name != "" {
				ev = ev.Str("event", clip(name))
			}
			if eventID := r.Header.Get(HeaderIdempotencyKey); eventID != "" {
				ev = ev.Str("event_id", clip(eventID))
			}
		}
		if runID != "" {
			ev = ev.Str("run_id", clip(runID))
		}
		ev.Msg("request")
	})
}

// usableRequestID reports whether a client's request ID may be echoed and
// logged as it is.
func usableRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// newRequestID is 16 random hex digits.
func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics if it cannot read)
	return hex.EncodeToString(b[:])
}
