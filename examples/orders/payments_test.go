package orders

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
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
