package inspector_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// The inspector's HTTP side: login, the cookie, the open inspector and the
// start-again action's refusals, with inspectortest's server. Its browser
// tests are in the checks module, with chromedp (checks/inspector).

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

const testToken = "s3cret-token"

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var form = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}

// With tokens, the page answers 401 with the login form until the browser
// holds a valid token in the cookie; /ui/login sets it (HttpOnly,
// SameSite=Strict) for a valid token only. The start-again action takes
// the cookie only with X-Jetflow-UI: 1.
func TestLoginAndCookie(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t, testToken)
	cookie := func(v string) string { return token.CookieName + "=" + token.CookieValue(v) }

	res := e.Send(http.MethodGet, "/ui/", nil, "")
	require.Equal(t, http.StatusUnauthorized, res.Code)
	require.Contains(t, res.Body, `<form method="post" action="/ui/login">`)
	require.NotContains(t, res.Body, "login-error")
	res = e.Send(http.MethodGet, "/ui/", http.Header{"Cookie": {cookie("wrong")}}, "")
	require.Equal(t, http.StatusUnauthorized, res.Code)
	require.Contains(t, res.Body, "That token is not valid.")

	res = e.Send(http.MethodPost, "/ui/login", form, url.Values{"token": {"wrong"}}.Encode())
	require.Equal(t, http.StatusUnauthorized, res.Code)
	require.Contains(t, res.Body, "That token is not valid.")
	require.Empty(t, res.Header.Values("Set-Cookie"))

	res = e.Send(http.MethodPost, "/ui/login", form, url.Values{"token": {testToken}}.Encode())
	require.Equal(t, http.StatusSeeOther, res.Code)
	require.Equal(t, "/ui/", res.Header.Get("Location"))
	set := strings.Join(res.Header.Values("Set-Cookie"), "\n")
	require.Contains(t, set, cookie(testToken))
	require.Contains(t, set, "HttpOnly")
	require.Contains(t, set, "SameSite=Strict")
	require.Contains(t, set, "Path=/")

	res = e.Send(http.MethodGet, "/ui/", http.Header{"Cookie": {cookie(testToken)}}, "")
	require.Equal(t, http.StatusOK, res.Code)
	require.Contains(t, res.Body, `<script src="/ui/assets/app.js"`)
	require.Contains(t, res.Body, `<form method="post" action="/ui/logout" class="logout" id="logout">`, "with tokens, Log out")
	require.Equal(t, http.StatusOK, e.Send(http.MethodGet, "/ui/assets/app.js", nil, "").Code, "the code is public")

	e.Start("fails", "declined-1", map[string]any{"n": 1})
	e.Wait("declined-1")
	path := "/ui/api/runs/declined-1/start-again"
	for _, h := range []http.Header{
		{"Cookie": {cookie(testToken)}}, // what a cross-site form sends
		{token.HeaderUI: {"1"}, "Cookie": {cookie("wrong")}},
		{"Authorization": {"Bearer wrong"}},
	} {
		res = e.Send(http.MethodPost, path, h, "")
		require.Equal(t, http.StatusUnauthorized, res.Code, "%v: %s", h, res.Body)
	}
	run, err := e.Client.GetRun(ctxT(t, 10*time.Second), "declined-1")
	require.NoError(t, err)
	require.Equal(t, 0, run.Generation, "a refused action changed nothing")

	res = e.Send(http.MethodPost, path, http.Header{token.HeaderUI: {"1"}, "Cookie": {cookie(testToken)}}, "")
	require.Equal(t, http.StatusOK, res.Code, res.Body)
	require.Contains(t, res.Body, `"outcome":"restarted"`)
	e.Wait("declined-1")
	run, err = e.Client.GetRun(ctxT(t, 10*time.Second), "declined-1")
	require.NoError(t, err)
	require.Equal(t, 1, run.Generation)
}

// Without tokens the inspector is open, as the API is, and shows no "Log
// out"; "/" leads to it.
// Starting a completed run again is refused (409): only failed and
// cancelled runs start again; an unknown run is 404.
func TestOpenInspectorAndStartAgainRefusals(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	res := e.Send(http.MethodGet, "/", nil, "")
	require.Equal(t, http.StatusFound, res.Code)
	require.Equal(t, "/ui/", res.Header.Get("Location"))
	res = e.Send(http.MethodGet, "/ui/", nil, "")
	require.Equal(t, http.StatusOK, res.Code)
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	require.Contains(t, res.Body, `<script src="/ui/assets/app.js"`)
	require.NotContains(t, res.Body, "Log out", "no tokens: nothing to log out of")
	require.NotContains(t, res.Body, "{{", "the page's template is executed")
	require.Equal(t, http.StatusNotFound, e.Send(http.MethodGet, "/ui/assets/", nil, "").Code, "no directory listing")
	require.Equal(t, http.StatusNotFound, e.Send(http.MethodGet, "/ui/assets/index.html", nil, "").Code, "the page's template is no asset")
	require.Equal(t, http.StatusOK, e.Send(http.MethodGet, "/ui/assets/app.css", nil, "").Code)
	require.Equal(t, http.StatusNotFound, e.Send(http.MethodGet, "/ui/nothing", nil, "").Code)

	e.Start("echo", "done-1", map[string]any{"n": 1})
	require.Equal(t, jetflow.StatusCompleted, e.Wait("done-1").Status)
	res = e.Send(http.MethodPost, "/ui/api/runs/done-1/start-again", nil, "")
	require.Equal(t, http.StatusConflict, res.Code, res.Body)
	require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
	res = e.Send(http.MethodPost, "/ui/api/runs/nobody-1/start-again", nil, "")
	require.Equal(t, http.StatusNotFound, res.Code, res.Body)
	res = e.Send(http.MethodPost, "/ui/api/runs/bad.id/start-again", nil, "")
	require.Equal(t, http.StatusBadRequest, res.Code, res.Body)
}
