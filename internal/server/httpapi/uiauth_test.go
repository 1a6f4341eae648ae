package httpapi

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/inspector/token"
)

// The web inspector's cookie is a token only together with the header
// X-Jetflow-UI: 1, which a cross-site form cannot send: the cookie alone,
// the header alone, or the header with a wrong cookie get 401; the bearer
// token works as before, and wins over a cookie.
func TestInspectorCookieNeedsUIHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Tokens = []string{"token-one"} })
	cookie := func(v string) string { return token.CookieName + "=" + token.CookieValue(v) }

	cases := []struct {
		name   string
		header http.Header
		code   int
	}{
		{"cookie without the UI header", http.Header{"Cookie": {cookie("token-one")}}, http.StatusUnauthorized},
		{"UI header without a cookie", http.Header{token.HeaderUI: {"1"}}, http.StatusUnauthorized},
		{"UI header with a wrong cookie", http.Header{token.HeaderUI: {"1"}, "Cookie": {cookie("token-two")}}, http.StatusUnauthorized},
		{"cookie with another UI header value", http.Header{token.HeaderUI: {"true"}, "Cookie": {cookie("token-one")}}, http.StatusUnauthorized},
		{"cookie with the UI header", http.Header{token.HeaderUI: {"1"}, "Cookie": {cookie("token-one")}}, http.StatusOK},
		{"a wrong bearer token is not saved by a good cookie", http.Header{"Authorization": {"Bearer nope"}, token.HeaderUI: {"1"}, "Cookie": {cookie("token-one")}}, http.StatusUnauthorized},
		{"bearer token", http.Header{"Authorization": {"Bearer token-one"}}, http.StatusOK},
	}
	for _, c := range cases {
		res := b.do(http.MethodGet, "/v1/runs", c.header, "")
		require.Equal(t, c.code, res.code, "%s: body: %s", c.name, res.body)
		if c.code == http.StatusUnauthorized {
			require.NotEmpty(t, res.header.Get("WWW-Authenticate"), c.name)
			require.NotContains(t, string(res.body), "token-", "a token never appears in an answer")
		}
	}

	// An action (a start) with the cookie and the header is authorized;
	// with the cookie alone it is refused before anything is stored.
	res := b.do(http.MethodPost, "/v1/workflows/echo/runs",
		http.Header{"Cookie": {cookie("token-one")}, HeaderIdempotencyKey: {"ui-auth-1"}}, `{"n":1}`)
	require.Equal(t, http.StatusUnauthorized, res.code)
	res = b.do(http.MethodGet, "/v1/runs/ui-auth-1", http.Header{"Authorization": {"Bearer token-one"}}, "")
	require.Equal(t, http.StatusNotFound, res.code, "the refused start stored nothing: %s", res.body)
	res = b.do(http.MethodPost, "/v1/workflows/echo/runs",
		http.Header{"Cookie": {cookie("token-one")}, token.HeaderUI: {"1"}, HeaderIdempotencyKey: {"ui-auth-1"}}, `{"n":1}`)
	require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
}
