package orders

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
)

// PaymentService is a tiny stand-in for a payment provider. It honours the
// Idempotency-Key header the way Stripe does:
//
//   - POST /charges without an Idempotency-Key is rejected with 400;
//   - the first request with a key creates a charge ("ch_<n>") and counts it;
//   - a repeat with the same key and body returns the same charge, with the
//     header "Idempotent-Replayed: true", and charges nothing;
//   - a repeat with the same key and another body is rejected with 422.
//
// GET /charges lists the charges made, with how many requests each key
// received since the service started, so that a demo can show one charge
// for two requests; GET /charges/count counts them (ChargeCount). Every
// request is logged with the run ID and workflow it came from. It is safe
// for concurrent use.
//
// It also stands in for the two providers the order workflow calls after
// the charge, each an EffectLedger honouring Idempotency-Key the same way:
// an email provider (POST /emails sends a receipt, "msg_<n>"; GET /emails
// lists them) and a shipping provider (POST /shipments books a shipment,
// "shp_<n>"; GET /shipments). Their ledgers are in memory only: unlike a
// charge, an email or shipment is forgotten when the service restarts.
//
// POST /answers/hold?after=K makes the service hold its answers once K
// charges are made (Hold), until POST /answers/release (Release): a caller
// that dies meanwhile was charged without learning it, the window a crash
// demo wants a kill to land in.
//
// With a ledger file (PaymentOptions.Ledger) every charge is appended to it
// before it is answered, and a restarted service reads it back: a charge
// survives the service's crash, and a retry after it is replayed, not
// charged again. The file is not synced to disk on every charge, so a power
// loss may lose the last ones; a stand-in needs no more.
type PaymentService struct {
	ln  net.Listener
	srv *http.Server
	log zerolog.Logger

	// Emails are the receipts sent (POST /emails), Shipments the
	// shipments booked (POST /shipments).
	Emails    *EffectLedger[ReceiptRequest]
	Shipments *EffectLedger[ShipmentRequest]

	mu     sync.Mutex
	byKey  map[string]*chargeEntry
	keys   []string // in the order the charges were made
	ledger *os.File // nil without a ledger
	// release, after Hold, is closed to release the held answers.
	release   chan struct{}
	holdAfter int // how many charges are made before answers are held
	held      int // answers waiting for release
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
	// Metadata is stored with the charge and logged, as a payment
	// provider's metadata is.
	Metadata ChargeMetadata `json:"metadata"`
}

// ChargeMetadata says which workflow asked for a charge.
type ChargeMetadata struct {
	Workflow string `json:"workflow,omitempty"`
}

// ChargeCount is the body of GET /charges/count.
type ChargeCount struct {
	// Charges is how many charges were made, replays not counted.
	Charges int `json:"charges"`
	// Held is how many answers are held (Hold), their charges made.
	Held int `json:"held"`
	// Orders is how many distinct orders were charged.
	Orders int `json:"orders"`
	// Duplicates is Charges - Orders: charges of an order already charged.
	Duplicates int `json:"duplicates"`
}

type chargeEntry struct {
	req      ChargeRequest
	charge   Charge
	requests int
}

// ledgerLine is one charge in the ledger file, a JSON line.
type ledgerLine struct {
	Request ChargeRequest `json:"request"`
	Charge  Charge        `json:"charge"`
}

// Header names of the idempotency contract.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// PaymentOptions configure StartPaymentService.
type PaymentOptions struct {
	// Addr is the address to listen on; "" is 127.0.0.1 on a random port.
	Addr string
	// Ledger, if not empty, is the file the charges are kept in: read on
	// start, appended to on every charge, created (with its directory) if
	// missing.
	Ledger string
	// Log gets a line for every request and for a failed ledger write.
	Log zerolog.Logger
}

// StartPaymentService reads the ledger, if any, listens on opts.Addr and
// serves until Close. A ledger it cannot read or parse is an error, and
// nothing is served.
func StartPaymentService(opts PaymentOptions) (*PaymentService, error) {
	p := &PaymentService{log: opts.Log, byKey: make(map[string]*chargeEntry),
		Emails: newEffectLedger[ReceiptRequest]("msg_"), Shipments: newEffectLedger[ShipmentRequest]("shp_")}
	if opts.Ledger != "" {
		if err := p.openLedger(opts.Ledger); err != nil {
			return nil, fmt.Errorf("payment service: %w", err)
		}
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.closeLedger()
		return nil, fmt.Errorf("payment service: %w", err)
	}
	p.ln = ln
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.create)
	mux.HandleFunc("GET /charges", p.list)
	mux.HandleFunc("GET /charges/count", p.count)
	p.Emails.mount(mux, "/emails")
	p.Shipments.mount(mux, "/shipments")
	mux.HandleFunc("POST /answers/hold", func(w http.ResponseWriter, r *http.Request) {
		after, err := strconv.Atoi(r.URL.Query().Get("after"))
		if err != nil || after < 0 {
			writeError(w, http.StatusBadRequest, "after: want the number of charges to hold answers after, 0 or more")
			return
		}
		p.Hold(after)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /answers/release", func(w http.ResponseWriter, _ *http.Request) {
		p.Release()
		w.WriteHeader(http.StatusNoContent)
	})
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error().Err(err).Msg("payment service stopped")
		}
	}()
	return p, nil
}

// openLedger reads the charges of the ledger file at path into p and keeps
// the file open for appending. A missing directory of path is created
// (the README keeps the ledger in the worker's data directory, which a
// fresh checkout does not have).
func (p *PaymentService) openLedger(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var line ledgerLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			f.Close()
			return fmt.Errorf("ledger %s line %d: %w", path, n, err)
		}
		p.keys = append(p.keys, line.Charge.IdempotencyKey)
		p.byKey[line.Charge.IdempotencyKey] = &chargeEntry{req: line.Request, charge: line.Charge}
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return fmt.Errorf("ledger %s: %w", path, err)
	}
	p.ledger = f
	return nil
}

func (p *PaymentService) closeLedger() error {
	if p.ledger == nil {
		return nil
	}
	return p.ledger.Close()
}

// URL is the service's base URL, such as http://127.0.0.1:41234.
func (p *PaymentService) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the service, closes its connections and its ledger.
func (p *PaymentService) Close() error {
	err := p.srv.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(err, p.closeLedger())
}

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

// Requests is how many accepted requests carried key since the service
// started, replays included.
func (p *PaymentService) Requests(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byKey[key]; ok {
		return e.requests
	}
	return 0
}

// RunIDOfKey is the run ID in a jetflow step ID used as Idempotency-Key
// ("order-o-1.charge.0" -> "order-o-1"): the key without its step name and
// occurrence. A key that is not a step ID is returned whole.
func RunIDOfKey(key string) string {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return key
	}
	j := strings.LastIndexByte(key[:i], '.')
	if j < 0 {
		return key
	}
	return key[:j]
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
	log := p.log.With().Str("run_id", RunIDOfKey(key)).Str("workflow", req.Metadata.Workflow).
		Str("idempotency_key", key).Logger()

	ch, replayed, err := p.charge(key, req)
	switch {
	case errors.Is(err, errKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key "+key+" was used with other parameters")
		return
	case err != nil:
		// Nothing was charged: the retry the 503 asks for is safe.
		log.Error().Err(err).Msg("payment service: POST /charges failed")
		writeError(w, http.StatusServiceUnavailable, "the charge could not be recorded, retry")
		return
	}
	log.Info().Str("charge_id", ch.ID).Bool("replayed", replayed).Msg("payment service: POST /charges")
	if !p.waitRelease(r.Context()) {
		return // the caller is gone; the charge stands
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeJSON(w, http.StatusOK, ch)
}

// Hold holds the answers to charge requests, after their charges are
// made, once after charges are made (from now on if that many are), until
// Release: the after-th charge's answer is the first held. A repeat call
// releases the answers held so far and holds again from its after.
func (p *PaymentService) Hold(after int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		close(p.release)
	}
	p.release = make(chan struct{})
	p.holdAfter = after
}

// Release sends the held answers and stops holding. A repeat call, or one
// without Hold, changes nothing.
func (p *PaymentService) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		close(p.release)
		p.release = nil
	}
}

// waitRelease waits while answers are held; false if ctx ended first.
func (p *PaymentService) waitRelease(ctx context.Context) bool {
	p.mu.Lock()
	release := p.release
	if release == nil || len(p.keys) < p.holdAfter {
		p.mu.Unlock()
		return true
	}
	p.held++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.held--
		p.mu.Unlock()
	}()
	select {
	case <-release:
		return true
	case <-ctx.Done():
		return false
	}
}

// errKeyReused is a repeat of a key with another request.
var errKeyReused = errors.New("idempotency key used with other parameters")

// charge makes the charge req under key, recording it in the ledger before
// it counts, or returns the charge already made under key (replayed). It
// fails with errKeyReused for a key made with another request, and with
// the write's error, charging nothing, when the ledger cannot be written.
func (p *PaymentService) charge(key string, req ChargeRequest) (_ Charge, replayed bool, _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byKey[key]; ok {
		if e.req != req {
			return Charge{}, false, errKeyReused
		}
		e.requests++
		return e.charge, true, nil
	}
	e := &chargeEntry{req: req, requests: 1, charge: Charge{
		ID: "ch_" + strconv.Itoa(len(p.keys)+1), OrderID: req.OrderID, AmountCents: req.AmountCents,
		Currency: req.Currency, IdempotencyKey: key,
	}}
	if p.ledger != nil {
		line, err := json.Marshal(ledgerLine{Request: req, Charge: e.charge})
		if err != nil {
			return Charge{}, false, err
		}
		if _, err := p.ledger.Write(append(line, '\n')); err != nil {
			return Charge{}, false, fmt.Errorf("ledger: %w", err)
		}
	}
	p.keys = append(p.keys, key)
	p.byKey[key] = e
	return e.charge, false, nil
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

// Count counts the charges made and the orders they charged.
func (p *PaymentService) Count() ChargeCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	orders := make(map[string]struct{}, len(p.keys))
	for _, e := range p.byKey {
		orders[e.charge.OrderID] = struct{}{}
	}
	return ChargeCount{Charges: len(p.keys), Held: p.held, Orders: len(orders), Duplicates: len(p.keys) - len(orders)}
}

func (p *PaymentService) count(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, p.Count())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// PaymentClient calls a PaymentService: charges, receipts and shipments
// (Charge, SendReceipt, BookShipment). Its errors are classified for a
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
	replayed, err = c.post(ctx, "/charges", key, req, &ch)
	return ch, replayed, err
}

// SendReceipt sends the receipt req under key, or returns the email
// already sent under key; replayed reports the latter.
func (c *PaymentClient) SendReceipt(ctx context.Context, key string, req ReceiptRequest) (e Effect, replayed bool, err error) {
	replayed, err = c.post(ctx, "/emails", key, req, &e)
	return e, replayed, err
}

// BookShipment books the shipment req under key, or returns the shipment
// already booked under key; replayed reports the latter.
func (c *PaymentClient) BookShipment(ctx context.Context, key string, req ShipmentRequest) (e Effect, replayed bool, err error) {
	replayed, err = c.post(ctx, "/shipments", key, req, &e)
	return e, replayed, err
}

// post sends req to path under the Idempotency-Key key and decodes the
// answer into out; replayed reports an answer the service had given
// before. Its errors are classified as PaymentClient's doc says.
func (c *PaymentClient) post(ctx context.Context, path, key string, req, out any) (replayed bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return false, jetflow.Fatal(err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return false, jetflow.Fatal(err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(HeaderIdempotencyKey, key)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return false, jetflow.Retryable(fmt.Errorf("POST %s: %w", path, err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, jetflow.Retryable(fmt.Errorf("POST %s: read response: %w", path, err))
	}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		err := fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
		if s, convErr := strconv.Atoi(resp.Header.Get("Retry-After")); convErr == nil && s > 0 {
			return false, jetflow.RetryAfter(err, time.Duration(s)*time.Second)
		}
		return false, jetflow.Retryable(err)
	default:
		return false, jetflow.Fatal(fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(b)))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return false, jetflow.Retryable(fmt.Errorf("POST %s: decode response: %w", path, err))
	}
	return resp.Header.Get(HeaderReplayed) == "true", nil
}
