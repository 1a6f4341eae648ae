package httpapi

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// With tokens, every /v1 route but webhooks and the OpenAPI document needs
// one of them as a bearer token.
func TestBearerAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Tokens = []string{"token-one", "token-two"} })

	res := b.post("echo", "auth-1", `{"n":1}`)
	require.Equal(t, http.StatusUnauthorized, res.code)
	require.Equal(t, `Bearer realm="jetflow"`, res.header.Get("WWW-Authenticate"))
	res.problem(t)

	for _, h := range []string{"Bearer token-three", "Bearer ", "Basic dG9rZW4tb25l", "token-one"} {
		res := b.do(http.MethodGet, "/v1/runs", http.Header{"Authorization": {h}}, "")
		require.Equal(t, http.StatusUnauthorized, res.code, h)
		require.NotEmpty(t, res.header.Get("WWW-Authenticate"))
		require.NotContains(t, string(res.body), "token-", "a token never appears in an answer")
	}

	for _, tok := range []string{"token-one", "token-two"} {
		res := b.do(http.MethodGet, "/v1/runs", http.Header{"Authorization": {"Bearer " + tok}}, "")
		require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	}
	res = b.do(http.MethodPost, "/v1/workflows/echo/runs",
		http.Header{"Authorization": {"bearer token-two"}, HeaderIdempotencyKey: {"auth-2"}}, `{"n":1}`)
	require.Equal(t, http.StatusCreated, res.code, "the scheme is case-insensitive")

	// Events need the token too: refused before anything is read.
	for _, path := range []string{"/v1/runs/auth-2/events/paid", "/v1/hooks/tok-1"} {
		res = b.do(http.MethodPost, path, http.Header{HeaderIdempotencyKey: {"e-1"}}, `{}`)
		require.Equal(t, http.StatusUnauthorized, res.code, path)
		res = b.do(http.MethodPost, path, http.Header{"Authorization": {"Bearer token-one"}, HeaderIdempotencyKey: {"e-1"}}, `{}`)
		require.NotEqual(t, http.StatusUnauthorized, res.code, "%s: body: %s", path, res.body)
	}

	require.Equal(t, http.StatusOK, b.do(http.MethodGet, "/v1/openapi.yaml", nil, "").code)
	// A webhook is authenticated by its signature: no token, and the
	// answer is about the signature.
	res = b.do(http.MethodPost, "/v1/webhooks/gh", nil, `{}`)
	require.Equal(t, http.StatusUnauthorized, res.code)
	require.Empty(t, res.header.Get("WWW-Authenticate"))
	require.Contains(t, res.problem(t).Detail, "webhook")
}

// Without tokens nothing is asked.
func TestNoAuthConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.do(http.MethodGet, "/v1/runs", http.Header{"Authorization": {"Bearer whatever"}}, "")
	require.Equal(t, http.StatusOK, res.code)
	require.Equal(t, http.StatusCreated, b.post("echo", "open-1", `{"n":1}`).code)
}
