package natsconn_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/config"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

const secret = "s3cret-Pa55"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// apply runs opts on default nats.Options, as nats.Connect does.
func apply(t *testing.T, opts []nats.Option) nats.Options {
	t.Helper()
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		require.NoError(t, opt(&o))
	}
	return o
}

func TestRegister(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := natsconn.Options{URL: "nats://127.0.0.1:4222"}
	natsconn.Register(fs, &o)
	for _, name := range []string{"nats-url", "nats-user", "nats-password", "nats-token", "nats-nkey", "nats-creds",
		"nats-tls-cert", "nats-tls-key", "nats-tls-ca"} {
		require.NotNil(t, fs.Lookup(name), name)
	}
	require.Equal(t, "nats://127.0.0.1:4222", fs.Lookup("nats-url").DefValue, "the URL in o is the default")

	origins, err := config.Load(fs, []string{"--nats-user", "app", "--nats-password", secret},
		func(k string) string { return map[string]string{"JETFLOW_NATS_TOKEN": "tok-" + secret}[k] })
	require.NoError(t, err)
	require.Equal(t, "app", o.User)
	require.Equal(t, secret, o.Password)
	require.Equal(t, "tok-"+secret, o.Token)

	var out bytes.Buffer
	require.NoError(t, config.Print(&out, fs, origins))
	require.Contains(t, out.String(), "nats-password: <redacted> # flag\n")
	require.Contains(t, out.String(), "nats-token: <redacted> # env JETFLOW_NATS_TOKEN\n")
	require.Contains(t, out.String(), "nats-user: app # flag\n")
	require.NotContains(t, out.String(), secret)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	certs := testenv.GenerateCerts(t)
	notPEM := writeFile(t, "not.pem", "hello")
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		o        natsconn.Options
		flag     string
		sentinel error
		want     string
	}{
		{name: "BadScheme", o: natsconn.Options{URL: "http://" + secret + "@h:4222"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: `scheme "http"`},
		{name: "NoHost", o: natsconn.Options{URL: "nats://h:1,nats://"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: "URL 2 of 2 has no host"},
		{name: "Unparsable", o: natsconn.Options{URL: "nats://u:" + secret + "@h:port"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: "does not parse"},
		{name: "UnescapedHashInPassword", o: natsconn.Options{URL: "nats://svc:2024#" + secret + "@h:4222"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: "percent-encode"},
		{name: "PrintedPassword", o: natsconn.Options{URL: "nats://app:xxxxx@h:4222"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: "placeholder"},
		{name: "PrintedToken", o: natsconn.Options{URL: "nats://redacted@h:4222"}, flag: "nats-url", sentinel: natsconn.ErrBadURL, want: "placeholder"},
		{name: "UserWithoutPassword", o: natsconn.Options{User: "app"}, flag: "nats-password", sentinel: natsconn.ErrIncomplete, want: "required with --nats-user"},
		{name: "PasswordWithoutUser", o: natsconn.Options{Password: secret}, flag: "nats-user", sentinel: natsconn.ErrIncomplete},
		{name: "TokenAndUser", o: natsconn.Options{User: "app", Password: secret, Token: secret}, flag: "nats-token", sentinel: natsconn.ErrConflict, want: "cannot be combined with --nats-user"},
		{
			name: "CredsAndNKey", o: natsconn.Options{NKeyFile: notPEM, CredsFile: notPEM}, flag: "nats-creds",
			sentinel: natsconn.ErrConflict, want: "--nats-nkey",
		},
		{name: "URLCredsAndUser", o: natsconn.Options{URL: "nats://a:" + secret + "@h", User: "b", Password: secret}, flag: "nats-user", sentinel: natsconn.ErrConflict, want: "--nats-url already carries credentials"},
		{name: "CertWithoutKey", o: natsconn.Options{TLSCert: certs.ClientCertFile}, flag: "nats-tls-key", sentinel: natsconn.ErrIncomplete},
		{name: "KeyWithoutCert", o: natsconn.Options{TLSKey: certs.ClientKeyFile}, flag: "nats-tls-cert", sentinel: natsconn.ErrIncomplete},
		{name: "MissingNKey", o: natsconn.Options{NKeyFile: "/nonexistent/user.nk"}, flag: "nats-nkey", sentinel: natsconn.ErrBadFile, want: "/nonexistent/user.nk"},
		{name: "MissingCreds", o: natsconn.Options{CredsFile: "/nonexistent/user.creds"}, flag: "nats-creds", sentinel: os.ErrNotExist},
		{name: "MissingCA", o: natsconn.Options{TLSCA: "/nonexistent/ca.pem"}, flag: "nats-tls-ca", sentinel: natsconn.ErrBadFile},
		{name: "DirectoryCA", o: natsconn.Options{TLSCA: dir}, flag: "nats-tls-ca", sentinel: natsconn.ErrBadFile, want: "not a regular file"},
		{name: "CANotPEM", o: natsconn.Options{TLSCA: notPEM}, flag: "nats-tls-ca", sentinel: natsconn.ErrBadFile, want: "no PEM certificate"},
		{name: "CertNotPEM", o: natsconn.Options{TLSCert: notPEM, TLSKey: certs.ClientKeyFile}, flag: "nats-tls-cert", sentinel: natsconn.ErrBadFile},
		{name: "KeyOfAnotherCert", o: natsconn.Options{TLSCert: certs.ClientCertFile, TLSKey: certs.ServerKeyFile}, flag: "nats-tls-cert", sentinel: natsconn.ErrBadFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.o.Validate()
			var se *natsconn.SettingError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.flag, se.Flag)
			require.ErrorIs(t, err, tc.sentinel)
			require.True(t, strings.HasPrefix(err.Error(), "invalid --"+tc.flag+": "), err.Error())
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret)
			_, err = tc.o.NATSOptions()
			require.ErrorIs(t, err, tc.sentinel, "NATSOptions validates")
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	t.Parallel()
	certs := testenv.GenerateCerts(t)
	for _, o := range []natsconn.Options{
		{},
		{URL: "nats://127.0.0.1:4222"},
		{URL: "127.0.0.1:4222, tls://b:4222,ws://c,wss://d:443"},
		{URL: "nats://app:" + secret + "@h:4222"},
		{URL: "nats://h", User: "app", Password: secret},
		{URL: "nats://h", Token: secret, TLSCA: certs.CAFile},
		{URL: "nats://h", TLSCert: certs.ClientCertFile, TLSKey: certs.ClientKeyFile, TLSCA: certs.CAFile},
	} {
		require.NoError(t, o.Validate(), "%+v", o)
	}
}

func TestNATSOptions(t *testing.T) {
	t.Parallel()
	certs := testenv.GenerateCerts(t)

	opts, err := natsconn.Options{URL: "nats://h", User: "app", Password: secret}.NATSOptions()
	require.NoError(t, err)
	o := apply(t, opts)
	require.Equal(t, "app", o.User)
	require.Equal(t, secret, o.Password)
	require.False(t, o.Secure)

	opts, err = natsconn.Options{Token: secret, TLSCert: certs.ClientCertFile, TLSKey: certs.ClientKeyFile, TLSCA: certs.CAFile}.NATSOptions()
	require.NoError(t, err)
	o = apply(t, opts)
	require.Equal(t, secret, o.Token)
	require.True(t, o.Secure)
	require.NotNil(t, o.TLSCertCB, "client certificate")
	require.NotNil(t, o.RootCAsCB, "CA")

	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	opts, err = natsconn.Options{NKeyFile: writeFile(t, "user.nk", string(seed))}.NATSOptions()
	require.NoError(t, err)
	require.Equal(t, pub, apply(t, opts).Nkey)

	_, err = natsconn.Options{NKeyFile: writeFile(t, "bad.nk", "not a seed")}.NATSOptions()
	require.ErrorIs(t, err, natsconn.ErrBadFile)
	require.ErrorContains(t, err, "invalid --nats-nkey")

	opts, err = natsconn.Options{CredsFile: writeFile(t, "user.creds", "creds")}.NATSOptions()
	require.NoError(t, err)
	require.NotNil(t, apply(t, opts).UserJWT, "credentials")

	opts, err = natsconn.Options{URL: "nats://h"}.NATSOptions()
	require.NoError(t, err)
	require.Empty(t, opts)
}

func TestSecurityFlags(t *testing.T) {
	t.Parallel()
	require.Empty(t, natsconn.Options{URL: "nats://h"}.SecurityFlags())
	require.Equal(t, []string{"nats-user", "nats-password", "nats-tls-ca"},
		natsconn.Options{User: "u", Password: "p", TLSCA: "ca"}.SecurityFlags())
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                  "nats://127.0.0.1:4222",
		"nats://app:" + secret + "@h:4222":       "nats://app:xxxxx@h:4222",
		"nats://" + secret + "@h:4222":           "nats://redacted@h:4222",
		"nats://a:1, tls://u:" + secret + "@b:2": "nats://a:1,tls://u:xxxxx@b:2",
		"h:4222":                                 "h:4222",
		"nats://u:" + secret + "@h:port":         "<invalid URL>",
		"nats://svc:2024#" + secret + "@h:4222":  "<redacted URL>", // '#' not escaped: no user parsed
		"nats://u:p@h:4222/#" + secret:           "nats://u:xxxxx@h:4222",
		"":                                       "",
	} {
		require.Equal(t, want, natsconn.Redact(in), in)
		require.Equal(t, want, natsconn.Options{URL: in}.Redacted(), in)
	}
}

func TestConnectUserPassword(t *testing.T) {
	t.Parallel()
	srv := testenv.UserPassServer(t, "app", secret)

	nc, err := natsconn.Options{URL: srv.URL, User: "app", Password: secret}.Connect(t.Name())
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Flush())

	_, err = natsconn.Options{URL: srv.URL, User: "app", Password: "wrong-" + secret}.Connect(t.Name())
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), secret)

	// Credentials in the URL work, and the error for wrong ones hides them.
	u := strings.Replace(srv.URL, "nats://", "nats://app:"+secret+"@", 1)
	nc2, err := natsconn.Options{URL: u}.Connect(t.Name())
	require.NoError(t, err)
	defer nc2.Close()
	u = strings.Replace(srv.URL, "nats://", "nats://app:wrong-"+secret+"@", 1)
	_, err = natsconn.Options{URL: u}.Connect(t.Name())
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), secret)
	require.ErrorContains(t, err, "app:xxxxx@127.0.0.1")
}

func TestConnectTLS(t *testing.T) {
	t.Parallel()
	srv := testenv.TLSServer(t, true)
	c := srv.Certs

	nc, err := natsconn.Options{URL: srv.URL, TLSCA: c.CAFile, TLSCert: c.ClientCertFile, TLSKey: c.ClientKeyFile}.Connect(t.Name())
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Flush())
	require.True(t, nc.TLSRequired())

	// Without the client certificate the server refuses the handshake.
	_, err = natsconn.Options{URL: srv.URL, TLSCA: c.CAFile}.Connect(t.Name())
	require.Error(t, err)

	// Trusting another CA, the client refuses the server.
	other := testenv.GenerateCerts(t)
	_, err = natsconn.Options{URL: srv.URL, TLSCA: other.CAFile, TLSCert: c.ClientCertFile, TLSKey: c.ClientKeyFile}.Connect(t.Name())
	require.Error(t, err)
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "got %v", err)
}

func TestConnectRequiresURL(t *testing.T) {
	t.Parallel()
	_, err := natsconn.Options{}.Connect(t.Name())
	require.ErrorIs(t, err, natsconn.ErrBadURL)
	require.ErrorContains(t, err, "invalid --nats-url")
}
