package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// secureWait bounds the wait for a secured server to be ready.
const secureWait = 10 * time.Second

// SecureServer is an embedded nats-server with JetStream that requires
// either a user and password (UserPassServer) or TLS (TLSServer). It uses
// its own store directory in t.TempDir() and a free port on 127.0.0.1, and
// is shut down when the test ends.
type SecureServer struct {
	// URL is the client URL, nats://127.0.0.1:<port>. It carries no
	// credentials.
	URL string
	// User and Password are the only credentials the server accepts
	// (UserPassServer).
	User, Password string
	// Certs are the files of the TLS setup (TLSServer); zero otherwise.
	Certs Certs
	// Server is the running server.
	Server *server.Server

	verifyClients bool
}

// ClientOptions are the nats.Options a client needs to connect: the user
// and password, or the CA and, when the server verifies clients, the client
// certificate.
func (s *SecureServer) ClientOptions() []nats.Option {
	var opts []nats.Option
	if s.User != "" {
		opts = append(opts, nats.UserInfo(s.User, s.Password))
	}
	if s.Certs.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.Certs.CAFile))
	}
	if s.verifyClients {
		opts = append(opts, nats.ClientCert(s.Certs.ClientCertFile, s.Certs.ClientKeyFile))
	}
	return opts
}

// Conn connects to s with ClientOptions; the connection is closed when t
// ends.
func (s *SecureServer) Conn(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := jetstream.Connect(s.URL, t.Name(), s.ClientOptions()...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// UserPassServer starts a server that accepts only user with password.
func UserPassServer(t testing.TB, user, password string) *SecureServer {
	t.Helper()
	opts := secureOptions(t)
	opts.Username, opts.Password = user, password
	s := startSecure(t, opts)
	s.User, s.Password = user, password
	return s
}

// TLSServer starts a server that requires TLS, with a certificate for
// 127.0.0.1 and localhost signed by a CA made for the test (GenerateCerts).
// With verifyClients it also requires a client certificate signed by that
// CA (Certs.ClientCertFile and ClientKeyFile).
func TLSServer(t testing.TB, verifyClients bool) *SecureServer {
	t.Helper()
	certs := GenerateCerts(t)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: certs.ServerCertFile, KeyFile: certs.ServerKeyFile, CaFile: certs.CAFile, Verify: verifyClients,
	})
	require.NoError(t, err)
	opts := secureOptions(t)
	opts.TLS, opts.TLSVerify, opts.TLSConfig, opts.TLSTimeout = true, verifyClients, tc, 5
	s := startSecure(t, opts)
	s.Certs, s.verifyClients = certs, verifyClients
	return s
}

func secureOptions(t testing.TB) *server.Options {
	return &server.Options{
		ServerName: "jetflow-secure",
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	}
}

func startSecure(t testing.TB, opts *server.Options) *SecureServer {
	t.Helper()
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	require.True(t, srv.ReadyForConnections(secureWait), "secure server not ready")
	require.Eventually(t, srv.JetStreamEnabled, secureWait, 10*time.Millisecond, "JetStream not enabled")
	return &SecureServer{URL: srv.ClientURL(), Server: srv}
}

// Certs are PEM files written to a t.TempDir(): a CA, a server certificate
// and key for 127.0.0.1, ::1 and localhost, and a client certificate and
// key, both signed by the CA. Key files are mode 0600.
type Certs struct {
	CAFile                        string
	ServerCertFile, ServerKeyFile string
	ClientCertFile, ClientKeyFile string
}

// GenerateCerts makes a fresh CA and certificates for one test. Two calls
// make two unrelated CAs, so a client trusting one is refused by a server
// of the other.
func GenerateCerts(t testing.TB) Certs {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "jetflow test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	leaf := func(name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: serial(t),
			Subject:      pkix.Name{CommonName: "jetflow test " + name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		certFile = writePEM(t, filepath.Join(dir, name+"-cert.pem"), "CERTIFICATE", der, 0o644)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		keyFile = writePEM(t, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", keyDER, 0o600)
		return certFile, keyFile
	}
	c := Certs{CAFile: writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER, 0o644)}
	c.ServerCertFile, c.ServerKeyFile = leaf("server", x509.ExtKeyUsageServerAuth)
	c.ClientCertFile, c.ClientKeyFile = leaf("client", x509.ExtKeyUsageClientAuth)
	// Fail here, not in a confusing handshake, if the files are unusable.
	_, err = tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
	require.NoError(t, err)
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	require.NoError(t, err)
	return n
}

func writePEM(t testing.TB, path, blockType string, der []byte, mode os.FileMode) string {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	require.NoError(t, os.WriteFile(path, data, mode))
	return path
}

// ConfigServer starts a nats-server from a configuration file (as
// nats-server -c would read it, includes and $VARIABLES resolved), on
// 127.0.0.1 with a free port and JetStream storing in t.TempDir(), shut down
// when t ends. It returns the client URL.
func ConfigServer(t testing.TB, confFile string) string {
	t.Helper()
	opts, err := server.ProcessConfigFile(confFile)
	require.NoError(t, err)
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	return startSecure(t, opts).URL
}
