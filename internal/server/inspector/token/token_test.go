package token

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// A cookie set the way the login sets it (http.SetCookie) carries any
// token back, bytes a cookie value may not hold included; the cookie
// counts for an API request only with X-Jetflow-UI: 1.
func TestCookieCarriesAnyToken(t *testing.T) {
	t.Parallel()
	odd := `we"ird; to,ken \ é`
	s, err := NewSet([]string{"plain", odd})
	require.NoError(t, err)
	for _, tok := range []string{"plain", odd} {
		rec := httptest.NewRecorder()
		http.SetCookie(rec, &http.Cookie{Name: CookieName, Value: CookieValue(tok)})
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Cookie", rec.Header().Get("Set-Cookie"))
		require.Equal(t, Valid, s.Cookie(r), tok)
		require.Equal(t, Missing, s.Request(r), "no X-Jetflow-UI header")
		r.Header.Set(HeaderUI, "1")
		require.Equal(t, Valid, s.Request(r), tok)
	}
	for _, v := range []string{CookieValue("other"), "not base64!", ""} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.AddCookie(&http.Cookie{Name: CookieName, Value: v})
		require.Equal(t, Invalid, s.Cookie(r), v)
	}
}

func TestBearerAndOpen(t *testing.T) {
	t.Parallel()
	s, err := NewSet([]string{" tok "})
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	require.Equal(t, Missing, s.Request(r))
	r.Header.Set("Authorization", "Bearer tok")
	require.Equal(t, Valid, s.Request(r), "surrounding white space of a configured token is ignored")
	r.Header.Set("Authorization", "Bearer nope")
	require.Equal(t, Invalid, s.Request(r))

	_, err = NewSet([]string{"a", "  "})
	require.Error(t, err, "an empty token")
	open, err := NewSet(nil)
	require.NoError(t, err)
	require.Equal(t, Open, open.Request(r))
	require.True(t, Open.OK())
	require.False(t, open.Match(""), "an open set matches no token")
}
