package inspector_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
)

const testToken = "s3cret-token"

// answer is one HTTP answer, read in full.
type answer struct {
	code   int
	header http.Header
	body   string
}

// send sends a request to the env's server without following redirects.
func (e *env) send(method, path string, header http.Header, body string) answer {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t, 30*time.Second), method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return answer{res.StatusCode, res.Header, string(b)}
}

var form = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}

// With tokens, the page answers 401 with the login form until the browser
// holds a valid token in the cookie; /ui/login sets it (HttpOnly,
// SameSite=Strict) for a valid token only. The start-again action takes
// the cookie only with X-Jetflow-UI: 1.
func TestLoginAndCookie(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	cookie := func(v string) string { return token.CookieName + "=" + token.CookieValue(v) }

	res := e.send(http.MethodGet, "/ui/", nil, "")
	require.Equal(t, http.StatusUnauthorized, res.code)
	require.Contains(t, res.body, `<form method="post" action="/ui/login">`)
	require.NotContains(t, res.body, "login-error")
	res = e.send(http.MethodGet, "/ui/", http.Header{"Cookie": {cookie("wrong")}}, "")
	require.Equal(t, http.StatusUnauthorized, res.code)
	require.Contains(t, res.body, "That token is not valid.")

	res = e.send(http.MethodPost, "/ui/login", form, url.Values{"token": {"wrong"}}.Encode())
	require.Equal(t, http.StatusUnauthorized, res.code)
	require.Contains(t, res.body, "That token is not valid.")
	require.Empty(t, res.header.Values("Set-Cookie"))

	res = e.send(http.MethodPost, "/ui/login", form, url.Values{"token": {testToken}}.Encode())
	require.Equal(t, http.StatusSeeOther, res.code)
	require.Equal(t, "/ui/", res.header.Get("Location"))
	set := strings.Join(res.header.Values("Set-Cookie"), "\n")
	require.Contains(t, set, cookie(testToken))
	require.Contains(t, set, "HttpOnly")
	require.Contains(t, set, "SameSite=Strict")
	require.Contains(t, set, "Path=/")

	res = e.send(http.MethodGet, "/ui/", http.Header{"Cookie": {cookie(testToken)}}, "")
	require.Equal(t, http.StatusOK, res.code)
	require.Contains(t, res.body, `<script src="/ui/assets/app.js"`)
	require.Equal(t, http.StatusOK, e.send(http.MethodGet, "/ui/assets/app.js", nil, "").code, "the code is public")

	e.start("fails", "declined-1", map[string]any{"n": 1})
	e.wait("declined-1")
	path := "/ui/api/runs/declined-1/start-again"
	for _, h := range []http.Header{
		{"Cookie": {cookie(testToken)}}, // what a cross-site form sends
		{token.HeaderUI: {"1"}, "Cookie": {cookie("wrong")}},
		{"Authorization": {"Bearer wrong"}},
	} {
		res = e.send(http.MethodPost, path, h, "")
		require.Equal(t, http.StatusUnauthorized, res.code, "%v: %s", h, res.body)
	}
	run, err := e.client.GetRun(ctxT(t, 10*time.Second), "declined-1")
	require.NoError(t, err)
	require.Equal(t, 0, run.Generation, "a refused action changed nothing")

	res = e.send(http.MethodPost, path, http.Header{token.HeaderUI: {"1"}, "Cookie": {cookie(testToken)}}, "")
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.Contains(t, res.body, `"outcome":"restarted"`)
	e.wait("declined-1")
	run, err = e.client.GetRun(ctxT(t, 10*time.Second), "declined-1")
	require.NoError(t, err)
	require.Equal(t, 1, run.Generation)
}

// Without tokens the inspector is open, as the API is; "/" leads to it.
// Starting a completed run again is refused (409): only failed and
// cancelled runs start again; an unknown run is 404.
func TestOpenInspectorAndStartAgainRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.send(http.MethodGet, "/", nil, "")
	require.Equal(t, http.StatusFound, res.code)
	require.Equal(t, "/ui/", res.header.Get("Location"))
	res = e.send(http.MethodGet, "/ui/", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	require.Contains(t, res.header.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, http.StatusNotFound, e.send(http.MethodGet, "/ui/assets/", nil, "").code, "no directory listing")
	require.Equal(t, http.StatusNotFound, e.send(http.MethodGet, "/ui/nothing", nil, "").code)

	e.start("echo", "done-1", map[string]any{"n": 1})
	require.Equal(t, jetflow.StatusCompleted, e.wait("done-1").Status)
	res = e.send(http.MethodPost, "/ui/api/runs/done-1/start-again", nil, "")
	require.Equal(t, http.StatusConflict, res.code, res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	res = e.send(http.MethodPost, "/ui/api/runs/nobody-1/start-again", nil, "")
	require.Equal(t, http.StatusNotFound, res.code, res.body)
	res = e.send(http.MethodPost, "/ui/api/runs/bad.id/start-again", nil, "")
	require.Equal(t, http.StatusBadRequest, res.code, res.body)
}

// In a browser: the page without a token and with a wrong one answers 401
// with the login form; the right token logs in and the list loads through
// the API with the cookie; an action with a cookie gone wrong is refused
// (401) and the page says so.
func TestBrowserAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	b := newBrowser(t)
	e.start("waiter", "held-1", map[string]any{"n": 1})

	require.EqualValues(t, http.StatusUnauthorized, b.navigate(e.srv.URL+"/ui/"))
	b.waitFor("the login form", `document.querySelector("#token") !== null`)
	resp, err := chromedp.RunResponse(b.ctx, chromedp.SendKeys("#token", "wrong", chromedp.ByQuery), chromedp.Submit("#token", chromedp.ByQuery))
	require.NoError(t, err)
	require.EqualValues(t, http.StatusUnauthorized, resp.Status)
	require.Equal(t, "That token is not valid.", b.text("#login-error"))
	b.screenshot("inspector-login")

	resp, err = chromedp.RunResponse(b.ctx, chromedp.SendKeys("#token", testToken, chromedp.ByQuery), chromedp.Submit("#token", chromedp.ByQuery))
	require.NoError(t, err)
	require.EqualValues(t, http.StatusOK, resp.Status)
	b.waitFor("the list", `document.querySelector('#runs-body tr[data-run-id="held-1"]') !== null`)
	var cookies []*network.Cookie
	b.run("cookies", chromedp.ActionFunc(func(ctx context.Context) error {
		var err error
		cookies, err = network.GetCookies().Do(ctx)
		return err
	}))
	require.Len(t, cookies, 1)
	require.Equal(t, token.CookieName, cookies[0].Name)
	require.True(t, cookies[0].HTTPOnly)
	require.Equal(t, network.CookieSameSiteStrict, cookies[0].SameSite)

	// The cookie goes wrong (the token was rotated) while the page is open:
	// the cancel is refused with 401, shown in the page, and the run runs.
	b.run("open the run", chromedp.Navigate(e.srv.URL+"/ui/#/runs/held-1"))
	b.waitFor("the cancel button", `document.querySelector("#cancel-run") !== null`)
	u, err := url.Parse(e.srv.URL)
	require.NoError(t, err)
	b.run("spoil the cookie", chromedp.ActionFunc(func(ctx context.Context) error {
		return network.SetCookie(token.CookieName, token.CookieValue("rotated")).WithDomain(u.Hostname()).WithPath("/").WithHTTPOnly(true).Do(ctx)
	}))
	b.run("cancel", chromedp.Click("#cancel-run", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the refusal", `document.querySelector("#action-result")?.textContent.startsWith("401")`)
	require.False(t, b.hidden("#banner"), "the log-in banner shows")
	run, err := e.client.GetRun(ctxT(t, 10*time.Second), "held-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusRunning, run.Status)

	require.EqualValues(t, http.StatusUnauthorized, b.navigate(e.srv.URL+"/ui/"), "the page with a wrong cookie")
	require.Equal(t, "That token is not valid.", b.text("#login-error"))
}
