package orders

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// TestEffectLedgers: the email and shipping providers make one effect per
// Idempotency-Key, replay it to a repeat, refuse a repeat with another
// body (422, fatal for the client) and a request without a key (400).
func TestEffectLedgers(t *testing.T) {
	t.Parallel()
	p := startPayments(t)
	pc := NewPaymentClient(p.URL(), nil)
	ctx := ctxT(t, 5*time.Second)

	rcpt := ReceiptRequest{To: "ada@example.com", OrderID: "o-1", ChargeID: "ch_1", AmountCents: 100, Currency: "eur"}
	e, replayed, err := pc.SendReceipt(ctx, "r.send-receipt.0", rcpt)
	require.NoError(t, err)
	require.False(t, replayed)
	require.Equal(t, Effect{ID: "msg_1", IdempotencyKey: "r.send-receipt.0"}, e)
	again, replayed, err := pc.SendReceipt(ctx, "r.send-receipt.0", rcpt)
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, e, again)
	require.Equal(t, 1, p.Emails.Made())
	require.Equal(t, 2, p.Emails.Requests("r.send-receipt.0"))

	other := rcpt
	other.To = "bob@example.com"
	_, _, err = pc.SendReceipt(ctx, "r.send-receipt.0", other)
	var fatal *jetflow.FatalError
	require.ErrorAs(t, err, &fatal)
	require.ErrorContains(t, err, "422")

	s, _, err := pc.BookShipment(ctx, "r.book-shipping.0", ShipmentRequest{OrderID: "o-1", ReservationID: "rsv_o-1"})
	require.NoError(t, err)
	require.Equal(t, "shp_1", s.ID)
	_, _, err = pc.BookShipment(ctx, "r.book-shipping.1", ShipmentRequest{OrderID: "o-1"})
	require.ErrorAs(t, err, &fatal, "a shipment without a reservation is refused")
	require.Equal(t, []string{"r.book-shipping.0"}, p.Shipments.Keys())
	require.Equal(t, []string{"r.send-receipt.0"}, p.Emails.Keys(), "nothing made by the refused requests")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/emails", strings.NewReader(`{"to":"a","order_id":"o","charge_id":"c"}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no Idempotency-Key")
	require.Equal(t, 1, p.Emails.Made())
}
