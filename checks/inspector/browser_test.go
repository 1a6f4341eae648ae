package inspector_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// The browser tests drive a real headless Chromium through the DevTools
// protocol with chromedp (Go-native, no Node). Chromium is looked for as
// JETFLOW_CHROMIUM, chromium, chromium-browser, google-chrome; without
// one the tests skip (CI installs Debian's chromium).

// browsers bounds the Chromium processes running at once: the tests are
// parallel, and each browser is a handful of processes.
var browsers = make(chan struct{}, 3)

// waitTimeout bounds each wait for the page. What a wait waits for takes
// at most a refresh tick and two requests (an action's, then the page's
// read of the run), each bounded on the server by
// inspectortest.RequestTimeout; the factor 2 is for a browser slowed down
// by a loaded machine. browserTimeout bounds each browser test, leaving
// time to record a failed wait's page.
const (
	waitTimeout    = 2 * (inspectortest.PageRefresh + 2*inspectortest.RequestTimeout)
	browserTimeout = 4 * waitTimeout
)

func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("JETFLOW_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium found (install Debian's chromium, or set JETFLOW_CHROMIUM): the browser tests need a real browser")
	return ""
}

// browser is one headless Chromium with one tab.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// browserTZ is the browsers' time zone: not UTC (and not a whole hour
// off it), so that a time the page shows in the browser's zone instead of
// UTC is seen.
const browserTZ = "Asia/Kolkata"

// newBrowser starts Chromium with a fresh profile (t.TempDir()), a
// 1366x768 window and the time zone browserTZ; it is closed when t ends.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath(t)
	browsers <- struct{}{}
	t.Cleanup(func() { <-browsers })
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 768),
		chromedp.Env("TZ=" + browserTZ),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// chromedp logs protocol events it does not model (the dialog's top
	// layer); those are not the page's errors.
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithErrorf(func(format string, args ...any) {
		if msg := fmt.Sprintf(format, args...); !strings.Contains(msg, "unhandled node event") {
			t.Logf("chromedp: %s", msg)
		}
	}))
	ctx, cancelTimeout := context.WithTimeout(ctx, browserTimeout)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Run(ctx, chromedp.EmulateViewport(1366, 768)), "starting Chromium at %s", path)
	return &browser{t: t, ctx: ctx}
}

// run runs actions, failing the test on an error.
func (b *browser) run(what string, actions ...chromedp.Action) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Run(b.ctx, actions...), what)
}

// text returns the text of the first element matching sel, once it is
// visible.
func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	b.run("text of "+sel, chromedp.WaitVisible(sel, chromedp.ByQuery), chromedp.Text(sel, &s, chromedp.ByQuery))
	return strings.TrimSpace(s)
}

// eval evaluates expr in the page into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	b.run("eval "+expr, chromedp.Evaluate(expr, out))
}

// waitFor polls the JavaScript condition cond (an expression) until it is
// true, within the test's browser deadline: the page refreshes itself, so
// the test waits on the DOM, never on a sleep.
func (b *browser) waitFor(what, cond string) {
	b.t.Helper()
	err := chromedp.Run(b.ctx, chromedp.Poll(cond, nil, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(waitTimeout)))
	if err != nil {
		var state string
		_ = chromedp.Run(b.ctx, chromedp.Evaluate(`location.href + "\n" + document.body.innerText`, &state))
		b.screenshot("failed-" + strings.ReplaceAll(b.t.Name(), "/", "_"))
		b.t.Fatalf("waiting for %s: %v; the page:\n%s", what, err, state)
	}
}

// status returns the status (code) and content of a navigation to url.
func (b *browser) navigate(url string) int64 {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Navigate(url))
	require.NoError(b.t, err, "navigating to %s", url)
	return resp.Status
}

// screenshot writes the page as name.png to $JETFLOW_ARTIFACTS (or the
// test's temp dir) and logs where.
func (b *browser) screenshot(name string) string {
	b.t.Helper()
	var png []byte
	b.run("screenshot", chromedp.FullScreenshot(&png, 100))
	return b.writePNG(name, png)
}

// viewScreenshot writes what the window shows (a modal dialog over the
// page, whose backdrop covers the window only) as screenshot does.
func (b *browser) viewScreenshot(name string) string {
	b.t.Helper()
	var png []byte
	b.run("screenshot", chromedp.CaptureScreenshot(&png))
	return b.writePNG(name, png)
}

func (b *browser) writePNG(name string, png []byte) string {
	b.t.Helper()
	dir := os.Getenv("JETFLOW_ARTIFACTS")
	if dir == "" {
		dir = b.t.TempDir()
	}
	require.NoError(b.t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name+".png")
	require.NoError(b.t, os.WriteFile(path, png, 0o644))
	b.t.Logf("screenshot: %s", path)
	return path
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string { return fmt.Sprintf("%q", s) }

// hidden reports whether the element matching sel has the hidden attribute.
func (b *browser) hidden(sel string) bool {
	b.t.Helper()
	var h bool
	b.eval(`document.querySelector(`+jsString(sel)+`).hidden`, &h)
	return h
}
