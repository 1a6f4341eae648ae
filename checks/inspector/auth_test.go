package inspector_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// The HTTP side of logging in is tested beside the inspector
// (internal/server/inspector, TestLoginAndCookie).

// In a browser: the page without a token and with a wrong one answers 401
// with the login form; the right token logs in and the list loads through
// the API with the cookie; an action with a cookie gone wrong is refused
// (401) and the page says so.
func TestBrowserAuth(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t, testToken)
	b := newBrowser(t)
	e.Start("waiter", "held-1", map[string]any{"n": 1})

	require.EqualValues(t, http.StatusUnauthorized, b.navigate(e.Srv.URL+"/ui/"))
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
	require.Equal(t, "Log out", b.text("#logout"), "with tokens, Log out is shown")
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
	b.run("open the run", chromedp.Navigate(e.Srv.URL+"/ui/#/runs/held-1"))
	b.waitFor("the cancel button", `document.querySelector("#cancel-run") !== null`)
	u, err := url.Parse(e.Srv.URL)
	require.NoError(t, err)
	b.run("spoil the cookie", chromedp.ActionFunc(func(ctx context.Context) error {
		return network.SetCookie(token.CookieName, token.CookieValue("rotated")).WithDomain(u.Hostname()).WithPath("/").WithHTTPOnly(true).Do(ctx)
	}))
	b.run("cancel", chromedp.Click("#cancel-run", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the refusal", `document.querySelector("#action-result")?.textContent.startsWith("401")`)
	require.False(t, b.hidden("#banner"), "the log-in banner shows")
	run, err := e.Client.GetRun(ctxT(t, 10*time.Second), "held-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusRunning, run.Status)

	require.EqualValues(t, http.StatusUnauthorized, b.navigate(e.Srv.URL+"/ui/"), "the page with a wrong cookie")
	require.Equal(t, "That token is not valid.", b.text("#login-error"))
}
