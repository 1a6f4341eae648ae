package orders

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func startPayments(t *testing.T) *PaymentService {
	t.Helper()
	p, err := StartPaymentService(PaymentOptions{Log: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// ctxT is a context bounded by d and by the test's end.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func postCharge(t *testing.T, p *PaymentService, key, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t, 5*time.Second), http.MethodPost, p.URL()+"/charges", strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp, out
}

func TestPaymentService(t *testing.T) {
	t.Parallel()
	const body = `{"order_id":"o-1","amount_cents":1999,"currency":"usd"}`

	t.Run("MissingKey", func(t *testing.T) {
		t.Parallel()
		p := startPayments(t)
		resp, out := postCharge(t, p, "", body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Contains(t, out["error"], "Idempotency-Key")
		require.Zero(t, p.Charges())
	})

	t.Run("InvalidBody", func(t *testing.T) {
		t.Parallel()
		p := startPayments(t)
		resp, _ := postCharge(t, p, "k1", `{"order_id":"o-1","amount_cents":0,"currency":"usd"}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		resp, _ = postCharge(t, p, "k1", `{"order_id":`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Zero(t, p.Charges())
	})

	t.Run("RepeatKeyReplaysCharge", func(t *testing.T) {
		t.Parallel()
		p := startPayments(t)
		first, ch1 := postCharge(t, p, "k1", body)
		require.Equal(t, http.StatusOK, first.StatusCode)
		require.Empty(t, first.Header.Get(HeaderReplayed))
		require.Equal(t, "ch_1", ch1["id"])

		again, ch2 := postCharge(t, p, "k1", body)
		require.Equal(t, http.StatusOK, again.StatusCode)
		require.Equal(t, "true", again.Header.Get(HeaderReplayed))
		require.Equal(t, ch1, ch2)
		require.Equal(t, 1, p.Charges())
		require.Equal(t, 1, p.ChargesFor("k1"))
		require.Equal(t, 2, p.Requests("k1"))

		_, ch3 := postCharge(t, p, "k2", body)
		require.Equal(t, "ch_2", ch3["id"])
		require.Equal(t, 2, p.Charges())
		require.Zero(t, p.ChargesFor("k3"))
	})

	t.Run("RepeatKeyOtherBody", func(t *testing.T) {
		t.Parallel()
		p := startPayments(t)
		postCharge(t, p, "k1", body)
		resp, out := postCharge(t, p, "k1", `{"order_id":"o-1","amount_cents":5,"currency":"usd"}`)
		require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		require.Contains(t, out["error"], "other parameters")
		require.Equal(t, 1, p.Charges())
		require.Equal(t, 1, p.Requests("k1"))
	})

	t.Run("ListCharges", func(t *testing.T) {
		t.Parallel()
		p := startPayments(t)
		postCharge(t, p, "k1", body)
		postCharge(t, p, "k1", body)
		req, err := http.NewRequestWithContext(ctxT(t, 5*time.Second), http.MethodGet, p.URL()+"/charges", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Charges int      `json:"charges"`
			Data    []Charge `json:"data"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Equal(t, 1, out.Charges)
		require.Equal(t, []Charge{{ID: "ch_1", OrderID: "o-1", AmountCents: 1999, Currency: "usd", IdempotencyKey: "k1", Requests: 2}}, out.Data)
	})
}

func TestPaymentClientClassifiesErrors(t *testing.T) {
	t.Parallel()
	p := startPayments(t)
	pc := NewPaymentClient(p.URL(), nil)
	ctx := ctxT(t, 5*time.Second)

	ch, replayed, err := pc.Charge(ctx, "k1", ChargeRequest{OrderID: "o-1", AmountCents: 100, Currency: "eur"})
	require.NoError(t, err)
	require.False(t, replayed)
	again, replayed, err := pc.Charge(ctx, "k1", ChargeRequest{OrderID: "o-1", AmountCents: 100, Currency: "eur"})
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, ch, again)

	// A rejected request is not worth retrying.
	_, _, err = pc.Charge(ctx, "k2", ChargeRequest{OrderID: "o-1"})
	var fatal *jetflow.FatalError
	require.ErrorAs(t, err, &fatal)

	// An unreachable service is.
	down := NewPaymentClient("http://127.0.0.1:1", nil)
	_, _, err = down.Charge(ctx, "k3", ChargeRequest{OrderID: "o-1", AmountCents: 100, Currency: "eur"})
	var retryable *jetflow.RetryableError
	require.ErrorAs(t, err, &retryable)
}

// TestPaymentLedgerSurvivesRestart: with a ledger, a restarted service
// knows the charges made before: a retry is replayed, the next charge gets
// the next ID, and a repeat key with another body is still refused.
func TestPaymentLedgerSurvivesRestart(t *testing.T) {
	t.Parallel()
	ledger := filepath.Join(t.TempDir(), "ledger.jsonl")
	const body = `{"order_id":"o-1","amount_cents":1999,"currency":"usd","metadata":{"workflow":"order"}}`
	start := func() *PaymentService {
		p, err := StartPaymentService(PaymentOptions{Ledger: ledger, Log: zerolog.New(zerolog.NewTestWriter(t))})
		require.NoError(t, err)
		return p
	}
	p := start()
	_, ch1 := postCharge(t, p, "order-o-1.charge.0", body)
	require.NoError(t, p.Close())

	p = start()
	defer p.Close()
	resp, again := postCharge(t, p, "order-o-1.charge.0", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(HeaderReplayed))
	require.Equal(t, ch1, again)
	resp, _ = postCharge(t, p, "order-o-1.charge.0", `{"order_id":"o-1","amount_cents":5,"currency":"usd"}`)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	_, ch2 := postCharge(t, p, "order-o-2.charge.0", `{"order_id":"o-2","amount_cents":1999,"currency":"usd"}`)
	require.Equal(t, "ch_2", ch2["id"])
	require.Equal(t, ChargeCount{Charges: 2, Orders: 2}, p.Count())
}

// TestPaymentLedgerDirectoryCreated: a ledger in a directory that does not
// exist yet (the README's jetflow-data/payments.jsonl in a fresh checkout)
// is created with its directory, and read back on the next start.
func TestPaymentLedgerDirectoryCreated(t *testing.T) {
	t.Parallel()
	ledger := filepath.Join(t.TempDir(), "jetflow-data", "payments.jsonl")
	p, err := StartPaymentService(PaymentOptions{Ledger: ledger, Log: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	postCharge(t, p, "order-o-1.charge.0", `{"order_id":"o-1","amount_cents":1999,"currency":"usd"}`)
	require.NoError(t, p.Close())
	_, err = os.Stat(ledger)
	require.NoError(t, err, "the ledger and its directory are created")

	p, err = StartPaymentService(PaymentOptions{Ledger: ledger, Log: zerolog.Nop()})
	require.NoError(t, err)
	defer p.Close()
	require.Equal(t, ChargeCount{Charges: 1, Orders: 1}, p.Count())
}

// TestPaymentLedgerCorrupt: a ledger that does not parse is an error that
// names its line, and the file is left as it was.
func TestPaymentLedgerCorrupt(t *testing.T) {
	t.Parallel()
	ledger := filepath.Join(t.TempDir(), "ledger.jsonl")
	content := []byte(`{"request":{"order_id":"o-1"},"charge":{"id":"ch_1","idempotency_key":"k1"}}` + "\nnot json\n")
	require.NoError(t, os.WriteFile(ledger, content, 0o644))
	_, err := StartPaymentService(PaymentOptions{Ledger: ledger, Log: zerolog.Nop()})
	require.ErrorContains(t, err, "line 2")
	after, err := os.ReadFile(ledger)
	require.NoError(t, err)
	require.Equal(t, content, after)
}

// TestPaymentCount: duplicates are charges of an order already charged
// under another key.
func TestPaymentCount(t *testing.T) {
	t.Parallel()
	p := startPayments(t)
	postCharge(t, p, "k1", `{"order_id":"o-1","amount_cents":1,"currency":"usd"}`)
	postCharge(t, p, "k1", `{"order_id":"o-1","amount_cents":1,"currency":"usd"}`)
	postCharge(t, p, "k2", `{"order_id":"o-1","amount_cents":1,"currency":"usd"}`)
	postCharge(t, p, "k3", `{"order_id":"o-2","amount_cents":1,"currency":"usd"}`)
	code, body := getBody(t, p.URL()+"/charges/count")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"charges":3,"held":0,"orders":2,"duplicates":1}`, body)
}

// TestPaymentHoldAnswers: once the after-th charge is made its answer, and
// every later one, waits for the release (or the next hold); the charges
// are made meanwhile.
func TestPaymentHoldAnswers(t *testing.T) {
	t.Parallel()
	p := startPayments(t)
	post := func(path string) int {
		req, err := http.NewRequestWithContext(ctxT(t, 5*time.Second), http.MethodPost, p.URL()+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusBadRequest, post("/answers/hold?after=x"))
	require.Equal(t, http.StatusNoContent, post("/answers/hold?after=2"))
	postCharge(t, p, "k1", `{"order_id":"o-1","amount_cents":1,"currency":"usd"}`) // charge 1: answered

	answered := make(chan string, 1)
	go func() {
		ch, _, err := NewPaymentClient(p.URL(), nil).Charge(t.Context(), "k2", ChargeRequest{OrderID: "o-2", AmountCents: 1, Currency: "usd"})
		if err != nil {
			answered <- err.Error()
		}
		answered <- ch.ID
	}()
	require.Eventually(t, func() bool { return p.Count().Held == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 2, p.Charges(), "the held charge is made")
	select {
	case id := <-answered:
		t.Fatalf("answered %s while held", id)
	default:
	}
	// A repeat hold releases what is held and holds from its own after.
	require.Equal(t, http.StatusNoContent, post("/answers/hold?after=100"))
	require.Equal(t, "ch_2", <-answered)
	require.Zero(t, p.Count().Held)
	postCharge(t, p, "k3", `{"order_id":"o-3","amount_cents":1,"currency":"usd"}`) // charge 3 < 100: answered
	require.Equal(t, http.StatusNoContent, post("/answers/release"))
	require.Equal(t, http.StatusNoContent, post("/answers/release"), "a repeat release changes nothing")
}

// TestPaymentLogLine: a charge's log line names its run and workflow.
func TestPaymentLogLine(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	p, err := StartPaymentService(PaymentOptions{Log: zerolog.New(&logs)})
	require.NoError(t, err)
	defer p.Close()
	postCharge(t, p, "order-o.1.charge.0", `{"order_id":"o-1","amount_cents":1,"currency":"usd","metadata":{"workflow":"order"}}`)
	var line map[string]any
	require.NoError(t, json.Unmarshal(logs.Bytes(), &line))
	require.Equal(t, "order-o.1", line["run_id"])
	require.Equal(t, "order", line["workflow"])
	require.Equal(t, "order-o.1.charge.0", line["idempotency_key"])
}

func TestRunIDOfKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"order-o-1.charge.0": "order-o-1",
		"a.b.c.charge.12":    "a.b.c",
		"k1":                 "k1",
		"k.1":                "k.1",
		"":                   "",
	} {
		require.Equal(t, want, RunIDOfKey(key), key)
	}
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t, 5*time.Second), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
