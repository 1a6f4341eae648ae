package orders

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
)

// ReceiptRequest is the body of POST /emails: the receipt of a charged
// order, sent to the customer.
type ReceiptRequest struct {
	To          string `json:"to"`
	OrderID     string `json:"order_id"`
	ChargeID    string `json:"charge_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// ShipmentRequest is the body of POST /shipments: book the shipping of a
// reserved order.
type ShipmentRequest struct {
	OrderID       string `json:"order_id"`
	ReservationID string `json:"reservation_id"`
}

func (r ReceiptRequest) valid() bool {
	return r.To != "" && r.OrderID != "" && r.ChargeID != ""
}

func (r ShipmentRequest) valid() bool { return r.OrderID != "" && r.ReservationID != "" }

// Effect is a side effect an EffectLedger made (an email sent, a shipment
// booked), as the service returns it.
type Effect struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Requests is how many requests carried this effect's key (only in
	// the GET listing).
	Requests int `json:"requests,omitempty"`
}

// EffectLedger is a stand-in for a provider that does one kind of side
// effect (send an email, book a shipment) and honours Idempotency-Key as
// the payment service does: the first request with a key makes the effect
// ("<prefix><n>"), a repeat with the same key and body returns it (with
// "Idempotent-Replayed: true") and makes nothing, a repeat with another
// body is refused with 422, and a request without a key with 400. Its
// ledger is in memory. It is safe for concurrent use.
type EffectLedger[R interface {
	comparable
	valid() bool
}] struct {
	prefix string

	mu    sync.Mutex
	byKey map[string]*effectEntry[R]
	keys  []string // in the order the effects were made
}

type effectEntry[R comparable] struct {
	req      R
	effect   Effect
	requests int
}

func newEffectLedger[R interface {
	comparable
	valid() bool
}](prefix string) *EffectLedger[R] {
	return &EffectLedger[R]{prefix: prefix, byKey: make(map[string]*effectEntry[R])}
}

// Made is how many effects were made, replays not counted.
func (l *EffectLedger[R]) Made() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Keys are the keys of the effects made, in the order they were made.
func (l *EffectLedger[R]) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// Requests is how many accepted requests carried key, replays included.
func (l *EffectLedger[R]) Requests(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byKey[key]; ok {
		return e.requests
	}
	return 0
}

// record makes the effect req under key, or returns the one made under key
// before (replayed); errKeyReused for a key made with another request.
func (l *EffectLedger[R]) record(key string, req R) (_ Effect, replayed bool, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byKey[key]; ok {
		if e.req != req {
			return Effect{}, false, errKeyReused
		}
		e.requests++
		return e.effect, true, nil
	}
	e := &effectEntry[R]{req: req, requests: 1,
		effect: Effect{ID: l.prefix + strconv.Itoa(len(l.keys)+1), IdempotencyKey: key}}
	l.keys = append(l.keys, key)
	l.byKey[key] = e
	return e.effect, false, nil
}

// create serves POST: make the effect the body asks for under the
// request's Idempotency-Key.
func (l *EffectLedger[R]) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is required")
		return
	}
	var req R
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return
	}
	if !req.valid() {
		writeError(w, http.StatusBadRequest, "a required field is missing")
		return
	}
	eff, replayed, err := l.record(key, req)
	if errors.Is(err, errKeyReused) {
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key "+key+" was used with other parameters")
		return
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeJSON(w, http.StatusOK, eff)
}

// list serves GET: every effect made, with the requests its key received.
func (l *EffectLedger[R]) list(w http.ResponseWriter, _ *http.Request) {
	l.mu.Lock()
	out := make([]Effect, 0, len(l.keys))
	for _, key := range l.keys {
		e := l.byKey[key]
		eff := e.effect
		eff.Requests = e.requests
		out = append(out, eff)
	}
	l.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"made": len(out), "data": out})
}

// mount serves l's POST and GET on path.
func (l *EffectLedger[R]) mount(mux *http.ServeMux, path string) {
	mux.HandleFunc("POST "+path, l.create)
	mux.HandleFunc("GET "+path, l.list)
}
