package orders

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
)

// PaymentService is a tiny in-process stand-in for a payment provider. It
// honours the Idempotency-Key header the way Stripe does:
//
//   - POST /charges without an Idempotency-Key is rejected with 400;
//   - the first request with a key creates a charge ("ch_<n>") and counts it;
//   - a repeat with the same key and body returns the same charge, with the
//     header "Idempotent-Replayed: true", and charges nothing;
//   - a repeat with the same key and another body is rejected with 422.
//
// GET /charges lists the charges made, with how many requests each key
// received, so that a demo can show one charge for two requests. It is safe
// for concurrent use.
type PaymentService struct {
	ln  net.Listener
	srv *http.Server
	log zerolog.Logger

	mu    sync.Mutex
	byKey map[string]*chargeEntry
	keys  []string // in the order the charges were made
}

// Charge is a charge as the payment service returns it.
type Charge struct {
	ID             string `json:"id"`
	OrderID        string `json:"order_id"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key"`
	// Requests is how many requests carried this charge's key (only in
	// GET /charges).
	Requests int `json:"requests,omitempty"`
}

// ChargeRequest is the body of POST /charges.
type ChargeRequest struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

type chargeEntry struct {
	req      ChargeRequest
	charge   Charge
	requests int
}

// Header names of the idempotency contract.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// StartPaymentService listens on addr ("" for 127.0.0.1 on a random port)
// and serves until Close. Every request is logged to log.
func StartPaymentService(addr string, log zerolog.Logger) (*PaymentService, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("payment service: %w", err)
	}
	p := &PaymentService{ln: ln, log: log, byKey: make(map[string]*chargeEntry)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.create)
	mux.HandleFunc("GET /charges", p.list)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("payment service stopped")
		}
	}()
	return p, nil
}

// URL is the service's base URL, such as http://127.0.0.1:41234.
func (p *PaymentService) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the service and closes its connections.
func (p *PaymentService) Close() error { return p.srv.Close() }

// Charges is how many real charges were made, replays not counted.
func (p *PaymentService) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys)
}

// ChargesFor is how many real charges were made under key: 0 or 1.
func (p *PaymentService) ChargesFor(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.byKey[key]; ok {
		return 1
	}
	return 0
}

// Requests is how many accepted requests carried key, replays included.
func (p *PaymentService) Requests(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byKey[key]; ok {
		return e.requests
	}
	return 0
}

func (p *PaymentService) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is required")
		return
	}
	var req ChargeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return
	}
	if req.OrderID == "" || req.AmountCents <= 0 || len(req.Currency) != 3 {
		writeError(w, http.StatusBadRequest, "order_id, a positive amount_cents and a 3-letter currency are required")
		return
	}

	p.mu.Lock()
	e, replayed := p.byKey[key]
	switch {
	case replayed && e.req != req:
		p.mu.Unlock()
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key "+key+" was used with other parameters")
		return
	case replayed:
		e.requests++
	default:
		p.keys = append(p.keys, key)
		e = &chargeEntry{req: req, requests: 1, charge: Charge{
			ID: "ch_" + strconv.Itoa(len(p.keys)), OrderID: req.OrderID, AmountCents: req.AmountCents,
			Currency: req.Currency, IdempotencyKey: key,
		}}
		p.byKey[key] = e
	}
	ch := e.charge
	p.mu.Unlock()

	p.log.Info().Str("idempotency_key", key).Str("charge_id", ch.ID).Bool("replayed", replayed).
		Msg("payment service: POST /charges")
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeJSON(w, http.StatusOK, ch)
}

func (p *PaymentService) list(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	out := make([]Charge, 0, len(p.keys))
	for _, key := range p.keys {
		e := p.byKey[key]
		ch := e.charge
		ch.Requests = e.requests
		out = append(out, ch)
	}
	p.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"charges": len(out), "data": out})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// PaymentClient calls a PaymentService. Its errors are classified for a
// jetflow step: a network error or a 5xx / 429 answer is retryable (the
// same Idempotency-Key makes the retry safe), any other 4xx is fatal.
type PaymentClient struct {
	baseURL string
	hc      *http.Client
}

// NewPaymentClient returns a client of the service at baseURL. A nil hc
// gets a client with a 10s timeout.
func NewPaymentClient(baseURL string, hc *http.Client) *PaymentClient {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	return &PaymentClient{baseURL: baseURL, hc: hc}
}

// Charge creates a charge under key, or returns the charge already made
// under key; replayed reports the latter.
func (c *PaymentClient) Charge(ctx context.Context, key string, req ChargeRequest) (ch Charge, replayed bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Charge{}, false, jetflow.Fatal(err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, false, jetflow.Fatal(err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(HeaderIdempotencyKey, key)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return Charge{}, false, jetflow.Retryable(fmt.Errorf("POST /charges: %w", err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Charge{}, false, jetflow.Retryable(fmt.Errorf("POST /charges: read response: %w", err))
	}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		err := fmt.Errorf("POST /charges: %s: %s", resp.Status, bytes.TrimSpace(b))
		if s, convErr := strconv.Atoi(resp.Header.Get("Retry-After")); convErr == nil && s > 0 {
			return Charge{}, false, jetflow.RetryAfter(err, time.Duration(s)*time.Second)
		}
		return Charge{}, false, jetflow.Retryable(err)
	default:
		return Charge{}, false, jetflow.Fatal(fmt.Errorf("POST /charges: %s: %s", resp.Status, bytes.TrimSpace(b)))
	}
	if err := json.Unmarshal(b, &ch); err != nil {
		return Charge{}, false, jetflow.Retryable(fmt.Errorf("POST /charges: decode response: %w", err))
	}
	return ch, resp.Header.Get(HeaderReplayed) == "true", nil
}
