package webhook

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// A template that could never give a valid hook token is refused when it
// is parsed (at config load), with ErrInvalidSource naming why.
func TestParseTokenTemplateRefusesTemplatesThatGiveNoToken(t *testing.T) {
	t.Parallel()
	for tpl, why := range map[string]string{
		"":                 "empty",
		"order-payment":    "no {field} placeholder",
		"order.{id}":       `'.' cannot be part`,
		"order {id}":       `' ' cannot be part`,
		"order-{id":        "'{' without '}'",
		"order-{a{b}}":     "'{' without '}'",
		"order-}{id}":      "'}' without '{'",
		"order-{}":         "empty placeholder",
		"order-{data..id}": "keys are",
		"order-{data.id!}": "keys are",
		"{a}{b}":           "need a literal between them",
		"x-{a}" + strings.Repeat("y", state.MaxRunIDLen): "longer than a hook token",
	} {
		_, err := ParseTokenTemplate(tpl)
		require.ErrorIs(t, err, ErrInvalidSource, tpl)
		require.ErrorContains(t, err, why, tpl)
	}
	for _, tpl := range []string{"{id}", "order-{data.object.metadata.order_id}-payment", "{a}-{b}", "k={items.0.id}"} {
		got, err := ParseTokenTemplate(tpl)
		require.NoError(t, err, tpl)
		require.Equal(t, tpl, got.String())
	}
}

// Token substitutes the body's fields, and refuses (ErrNoToken) a body
// whose field is missing, of another type, or holds a character a token
// cannot.
func TestTokenTemplateToken(t *testing.T) {
	t.Parallel()
	tpl, err := ParseTokenTemplate("order-{data.object.metadata.order_id}-{data.items.1}")
	require.NoError(t, err)
	for body, want := range map[string]string{
		`{"data":{"object":{"metadata":{"order_id":"o-42"}},"items":[1,7]}}`:      "order-o-42-7",
		`{"data":{"object":{"metadata":{"order_id":"A_b=9"}},"items":["x","y"]}}`: "order-A_b=9-y",
	} {
		got, err := tpl.Token([]byte(body))
		require.NoError(t, err, body)
		require.Equal(t, want, got)
		require.NoError(t, state.ValidateHookToken(got))
	}
	for body, why := range map[string]string{
		`not json`: "not JSON",
		`{"data":{"object":{"metadata":{}},"items":[1,2]}}`:                                              "no field data.object.metadata.order_id",
		`{"data":{"object":{"metadata":{"order_id":"o.42"}},"items":[1,2]}}`:                             "cannot be part of a hook token",
		`{"data":{"object":{"metadata":{"order_id":""}},"items":[1,2]}}`:                                 "cannot be part of a hook token",
		`{"data":{"object":{"metadata":{"order_id":{"x":1}}},"items":[1,2]}}`:                            "not a string or an integer",
		`{"data":{"object":{"metadata":{"order_id":"o"}},"items":[1]}}`:                                  "no field data.items.1",
		`{"data":{"object":{"metadata":{"order_id":"o"}},"items":[1,2.5]}}`:                              "not an integer",
		`{"data":{"object":{"metadata":{"order_id":"` + strings.Repeat("x", 130) + `"}},"items":[1,2]}}`: "invalid hook token",
	} {
		_, err := tpl.Token([]byte(body))
		require.ErrorIs(t, err, ErrNoToken, body)
		require.ErrorContains(t, err, why, body)
	}
	_, err = TokenTemplate{}.Token([]byte(`{}`))
	require.ErrorIs(t, err, ErrNoToken, "the zero template")
}

// Resume rules: refused on GitHub (unsigned event type), for an empty or
// repeated type and without a template; ResumeFor matches the type exactly.
func TestSourceResumeRules(t *testing.T) {
	t.Parallel()
	tpl, err := ParseTokenTemplate("order-{data.object.metadata.order_id}")
	require.NoError(t, err)
	src := Source{Name: "stripe", Provider: Stripe, Workflow: "order", Secrets: []string{"whsec_x"},
		Resume: []Resume{{Type: "payment_intent.succeeded", Token: tpl}}}
	require.NoError(t, src.Validate())
	r, ok := src.ResumeFor(Event{ID: "evt_1", Type: "payment_intent.succeeded"})
	require.True(t, ok)
	require.Equal(t, tpl.String(), r.Token.String())
	for _, typ := range []string{"", "payment_intent.created", "Payment_intent.succeeded"} {
		_, ok = src.ResumeFor(Event{ID: "evt_1", Type: typ})
		require.False(t, ok, typ)
	}

	for why, edit := range map[string]func(*Source){
		"GitHub does not sign": func(s *Source) { s.Provider, s.Secrets = GitHub, []string{"x"} },
		"empty event type":     func(s *Source) { s.Resume = []Resume{{Token: tpl}} },
		"given twice":          func(s *Source) { s.Resume = append(s.Resume, s.Resume[0]) },
		"no token template":    func(s *Source) { s.Resume = []Resume{{Type: "t"}} },
	} {
		bad := src
		bad.Resume = append([]Resume(nil), src.Resume...)
		edit(&bad)
		err := bad.Validate()
		require.ErrorIs(t, err, ErrInvalidSource, why)
		require.ErrorContains(t, err, why)
	}
}
