package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/webhook"
)

// TestStartAndListByAttributes: a start's attr.<name>=<value> query
// parameters become the run's attributes (shown on the run), GET
// /v1/runs?attr.<name>=<value> lists exactly the runs with them, newest
// first, combined with the other filters, and a bad attribute — on a
// start or a list — is a 400 problem naming it, with nothing stored.
func TestStartAndListByAttributes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	postAttrs := func(key, query string) response {
		h := http.Header{"Content-Type": {"application/json"}, HeaderIdempotencyKey: {key}}
		return b.do(http.MethodPost, "/v1/workflows/echo/runs?"+query, h, `{"n":1}`)
	}
	var want []string
	for i := range 4 {
		id := fmt.Sprintf("att-%d", i)
		customer := "7"
		if i%2 == 1 {
			customer = "8"
			want = append([]string{id}, want...)
		}
		res := postAttrs(id, "attr.order_id=42&attr.customer="+customer+"&attr.note="+url.QueryEscape("a b.c"))
		require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
		b.waitDone(id)
	}
	require.Equal(t, http.StatusCreated, postAttrs("att-other", "attr.order_id=43").code)
	b.waitDone("att-other")

	var run jetflow.Run
	b.do(http.MethodGet, "/v1/runs/att-1", nil, "").json(t, &run)
	require.Equal(t, map[string]string{"order_id": "42", "customer": "8", "note": "a b.c"}, run.Attributes)

	b.waitListed("attr.order_id=42&attr.customer=8", want)
	b.waitListed("attr.customer=8&status=completed&workflow=echo&limit=1", want[:1])
	b.waitListed("attr.note="+url.QueryEscape("a b.c")+"&prefix=att-3", []string{"att-3"})
	b.waitListed("attr.order_id=44", nil)

	for _, bad := range []struct{ query, names string }{
		{"attr.Order=1", `"Order"`},
		{"attr.order_id=", "order_id: empty value"},
		{"attr.order_id=" + strings.Repeat("9", 65), "order_id: value is 65 bytes"},
		{"attr.order_id=1&attr.order_id=2", `"order_id" given 2 times`},
	} {
		res := b.do(http.MethodGet, "/v1/runs?"+bad.query, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, bad.query)
		require.Contains(t, res.problem(t).Detail, bad.names, bad.query)

		res = postAttrs("att-bad", bad.query)
		require.Equal(t, http.StatusBadRequest, res.code, bad.query)
		require.Contains(t, res.problem(t).Detail, bad.names, bad.query)
	}
	require.Equal(t, http.StatusNotFound, b.do(http.MethodGet, "/v1/runs/att-bad", nil, "").code, "a refused start stores nothing")
}

// TestWebhookAttributes: a webhook source's attributes are read from each
// verified event's payload by JSON pointer, and the run the event starts
// is found by them; an attribute the payload does not give (no such
// field, an object, a value over the limits) is left out and the event
// still starts its run.
func TestWebhookAttributes(t *testing.T) {
	t.Parallel()
	ptr := func(s string) webhook.Pointer {
		p, err := webhook.ParsePointer(s)
		require.NoError(t, err)
		return p
	}
	src := testSources[2] // stripe
	src.Name = "shop"
	src.Attributes = map[string]webhook.Pointer{
		"order_id": ptr("/data/object/metadata/order_id"), "customer": ptr("/data/object/customer"),
		"amount": ptr("/data/object/amount"), "missing": ptr("/data/nothing"), "nested": ptr("/data/object/metadata"),
		"long": ptr("/data/object/long"),
	}
	b := setup(t, func(c *Config) { c.Sources = append(append([]webhook.Source{}, testSources...), src) })
	body := `{"id":"evt_a1","type":"charge.succeeded","data":{"object":{"customer":"cus_7","amount":1999,` +
		`"long":"` + strings.Repeat("x", 65) + `","metadata":{"order_id":"42"}}}}`
	res := b.deliver("shop", signed(src, "evt_a1", testNow, body))
	require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)

	run, err := b.client.GetRun(ctxT(t, 10*time.Second), "shop-evt_a1")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"order_id": "42", "customer": "cus_7", "amount": "1999"}, run.Attributes)
	b.waitListed("attr.order_id=42&workflow=hook", []string{"shop-evt_a1"})
}
