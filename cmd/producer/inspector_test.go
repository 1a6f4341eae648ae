package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/inspector/token"
)

// producer serve mounts the web inspector under /ui/ (and / leads there),
// protected by the API's tokens: the login form (401) without one, the
// page with the cookie the login sets.
func TestServeMountsTheInspector(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	base, _, stop := startServe(t, tb, nil, "--api-token", "tok-1")

	for _, path := range []string{"/ui/", "/"} { // / redirects to /ui/
		res := do(t, http.MethodGet, base+path, nil, nil)
		require.Equal(t, http.StatusUnauthorized, res.code, path)
		require.Contains(t, res.body, `action="/ui/login"`, path)
	}
	res := do(t, http.MethodGet, base+"/ui/", http.Header{"Cookie": {token.CookieName + "=" + token.CookieValue("tok-1")}}, nil)
	require.Equal(t, http.StatusOK, res.code)
	require.Contains(t, res.body, "/ui/assets/app.js")
	res = do(t, http.MethodGet, base+"/v1/runs", http.Header{"Cookie": {token.CookieName + "=" + token.CookieValue("tok-1")}, token.HeaderUI: {"1"}}, nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.NoError(t, stop())
}
