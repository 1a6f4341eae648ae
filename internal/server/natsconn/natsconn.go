// Package natsconn holds the NATS connection settings that jetflow's
// commands share: the server URL, one authentication method (user and
// password, token, NKey seed file or JWT credentials file) and TLS files.
//
// Register adds them to a flag.FlagSet as --nats-* flags (password and token
// marked secret for package config), Validate checks them with errors that
// name the flag, and NATSOptions or Connect turn them into a connection.
// Secrets never appear in an error message; log URLs through Redact.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/server/config"
)

// Flag names, as Register defines them.
const (
	FlagURL      = "nats-url"
	FlagUser     = "nats-user"
	FlagPassword = "nats-password"
	FlagToken    = "nats-token"
	FlagNKey     = "nats-nkey"
	FlagCreds    = "nats-creds"
	FlagTLSCert  = "nats-tls-cert"
	FlagTLSKey   = "nats-tls-key"
	FlagTLSCA    = "nats-tls-ca"
)

// Sentinel errors, matched with errors.Is on a *SettingError.
var (
	// ErrIncomplete: one half of a pair (user and password, certificate and
	// key) without the other.
	ErrIncomplete = errors.New("incomplete")
	// ErrConflict: two settings that cannot be used together, such as two
	// authentication methods.
	ErrConflict = errors.New("conflicting settings")
	// ErrBadFile: a file that cannot be read or does not hold what the flag
	// needs.
	ErrBadFile = errors.New("unusable file")
	// ErrBadURL: a server URL that is not a nats, tls, ws or wss URL with a
	// host.
	ErrBadURL = errors.New("invalid URL")
)

// SettingError is a connection setting that cannot be used. Its message
// names the flag and never holds a secret.
type SettingError struct {
	Flag string // without dashes, e.g. "nats-user"
	Err  error  // wraps one of the sentinels
}

// Error reads `invalid --nats-x: reason`.
func (e *SettingError) Error() string { return "invalid --" + e.Flag + ": " + e.Err.Error() }

// Unwrap returns the reason.
func (e *SettingError) Unwrap() error { return e.Err }

func settingErr(flag string, sentinel error, format string, args ...any) error {
	return &SettingError{Flag: flag, Err: fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)}
}

// Options are the settings of one NATS connection. The zero value connects
// to nothing: URL is required by Connect.
type Options struct {
	// URL is one server URL or a comma-separated list of them. Credentials
	// in it (nats://user:pass@host, nats://token@host) work but are better
	// given through User and Password or Token, which stay out of logs.
	URL string
	// User and Password authenticate by user name; both or neither.
	User     string
	Password string
	// Token authenticates with a token.
	Token string
	// NKeyFile is an NKey user seed file.
	NKeyFile string
	// CredsFile is a JWT user credentials file (.creds).
	CredsFile string
	// TLSCert and TLSKey are a PEM client certificate and its key, for
	// servers that verify clients; both or neither.
	TLSCert string
	TLSKey  string
	// TLSCA is a PEM file of certificate authorities that signed the
	// server's certificate; without it the system roots are used.
	TLSCA string
}

// Register defines the --nats-* flags on fs, bound to o's fields, with o's
// current values as defaults, and marks --nats-password and --nats-token
// secret (config.Secret). Call it once per FlagSet: a second call panics, as
// defining a flag twice does.
func Register(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.URL, FlagURL, o.URL, "NATS server `URL`, or a comma-separated list of them")
	fs.StringVar(&o.User, FlagUser, o.User, "NATS user `name` (with --nats-password)")
	fs.StringVar(&o.Password, FlagPassword, o.Password, "NATS `password` (secret: prefer the environment or a config file)")
	fs.StringVar(&o.Token, FlagToken, o.Token, "NATS authentication `token` (secret)")
	fs.StringVar(&o.NKeyFile, FlagNKey, o.NKeyFile, "NKey user seed `file`")
	fs.StringVar(&o.CredsFile, FlagCreds, o.CredsFile, "JWT user credentials `file` (.creds)")
	fs.StringVar(&o.TLSCert, FlagTLSCert, o.TLSCert, "PEM client certificate `file` (with --nats-tls-key)")
	fs.StringVar(&o.TLSKey, FlagTLSKey, o.TLSKey, "PEM client private key `file` (with --nats-tls-cert)")
	fs.StringVar(&o.TLSCA, FlagTLSCA, o.TLSCA, "PEM `file` of CAs to trust for the server's certificate (default: system roots)")
	config.Secret(fs, FlagPassword, FlagToken)
	config.Redactor(fs, FlagURL, Redact) // nats://user:password@host
}

// SecurityFlags names the authentication and TLS flags that are set, in
// the order Register defines them: what an embedded server, which has
// neither, must refuse.
func (o Options) SecurityFlags() []string {
	var set []string
	for _, f := range []struct{ name, v string }{
		{FlagUser, o.User}, {FlagPassword, o.Password}, {FlagToken, o.Token}, {FlagNKey, o.NKeyFile},
		{FlagCreds, o.CredsFile}, {FlagTLSCert, o.TLSCert}, {FlagTLSKey, o.TLSKey}, {FlagTLSCA, o.TLSCA},
	} {
		if f.v != "" {
			set = append(set, f.name)
		}
	}
	return set
}

// Validate reports the first unusable setting as a *SettingError naming its
// flag: a malformed URL; a user without a password or the reverse; two
// authentication methods at once (including credentials in the URL next to
// a flag); a certificate without its key or the reverse; a file that cannot
// be read; a TLS certificate, key or CA file that does not parse. An empty
// URL is valid here: whether one is required is the caller's call.
func (o Options) Validate() error {
	urlHasCreds, err := checkURLs(o.URL)
	if err != nil {
		return err
	}
	switch {
	case o.User != "" && o.Password == "":
		return settingErr(FlagPassword, ErrIncomplete, "required with --%s", FlagUser)
	case o.Password != "" && o.User == "":
		return settingErr(FlagUser, ErrIncomplete, "required with --%s", FlagPassword)
	case o.TLSCert != "" && o.TLSKey == "":
		return settingErr(FlagTLSKey, ErrIncomplete, "required with --%s", FlagTLSCert)
	case o.TLSKey != "" && o.TLSCert == "":
		return settingErr(FlagTLSCert, ErrIncomplete, "required with --%s", FlagTLSKey)
	}
	var auth []string
	for _, m := range []struct{ flag, v string }{
		{FlagUser, o.User}, {FlagToken, o.Token}, {FlagNKey, o.NKeyFile}, {FlagCreds, o.CredsFile},
	} {
		if m.v == "" {
			continue
		}
		if urlHasCreds {
			return settingErr(m.flag, ErrConflict, "--%s already carries credentials", FlagURL)
		}
		if len(auth) > 0 {
			return settingErr(m.flag, ErrConflict, "cannot be combined with --%s: give one authentication method", auth[0])
		}
		auth = append(auth, m.flag)
	}
	for _, f := range []struct{ flag, path string }{
		{FlagNKey, o.NKeyFile}, {FlagCreds, o.CredsFile}, {FlagTLSCert, o.TLSCert}, {FlagTLSKey, o.TLSKey}, {FlagTLSCA, o.TLSCA},
	} {
		if err := checkReadable(f.flag, f.path); err != nil {
			return err
		}
	}
	if o.TLSCert != "" {
		// The key's content is secret; tls errors describe, never quote it.
		if _, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey); err != nil {
			return settingErr(FlagTLSCert, ErrBadFile, "with key %s: %w", o.TLSKey, err)
		}
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return settingErr(FlagTLSCA, ErrBadFile, "%w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return settingErr(FlagTLSCA, ErrBadFile, "no PEM certificate in %s", o.TLSCA)
		}
	}
	return nil
}

// checkReadable fails unless path is empty or a readable regular file.
func checkReadable(flag, path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return settingErr(flag, ErrBadFile, "%w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return settingErr(flag, ErrBadFile, "%w", err)
	}
	if !fi.Mode().IsRegular() {
		return settingErr(flag, ErrBadFile, "%s is not a regular file", path)
	}
	return nil
}

// NATSOptions validates o and returns the nats.Options it stands for:
// nats.UserInfo, nats.Token, nats.NkeyOptionFromSeed, nats.UserCredentials,
// nats.ClientCert and nats.RootCAs, as set. Connection names, reconnect
// settings and handlers are the caller's.
func (o Options) NATSOptions() ([]nats.Option, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	case o.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, settingErr(FlagNKey, ErrBadFile, "%w", err)
		}
		opts = append(opts, opt)
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	return opts, nil
}

// Connect validates o and dials o.URL through jetstream.Connect (unlimited
// reconnects, no reconnect buffer) with o's options followed by extra. An
// error's message shows the URL redacted (see Redact); it unwraps to the
// underlying error. Every call opens a new connection.
func (o Options) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	if o.URL == "" {
		return nil, settingErr(FlagURL, ErrBadURL, "required")
	}
	opts, err := o.NATSOptions()
	if err != nil {
		return nil, err
	}
	nc, err := jetstream.Connect(o.URL, name, append(opts, extra...)...)
	if err != nil {
		return nil, &redactedError{msg: strings.ReplaceAll(err.Error(), o.URL, Redact(o.URL)), err: err}
	}
	return nc, nil
}

// Redacted is o.URL as it may be logged (see Redact).
func (o Options) Redacted() string { return Redact(o.URL) }

// redactedError shows a message with the URL redacted and unwraps to the
// original error.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Redact returns the server URL list s with credentials hidden: a password
// becomes "xxxxx" and a user-only part (a token) becomes "redacted"; only
// scheme, credentials and host of a URL with credentials are kept. A URL
// that does not parse is replaced by "<invalid URL>", and one whose "@" did
// not parse as credentials (a password with an unescaped '#', '?' or '/')
// by "<redacted URL>", since neither can be redacted reliably.
func Redact(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := parseURL(p)
		switch {
		case err != nil:
			parts[i] = "<invalid URL>"
		case u.User == nil && strings.Contains(p, "@"):
			parts[i] = "<redacted URL>"
		case u.User == nil:
			parts[i] = strings.TrimSpace(p)
		default:
			user := "redacted"
			if _, hasPassword := u.User.Password(); hasPassword {
				user = u.User.Username() + ":xxxxx"
			}
			parts[i] = u.Scheme + "://" + user + "@" + u.Host
		}
	}
	return strings.Join(parts, ",")
}

// parseURL parses one server URL as nats.go does: a missing scheme means
// nats://.
func parseURL(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	return url.Parse(s)
}

// checkURLs validates the URL list s and reports whether any URL carries
// credentials. Errors locate the bad URL by position, not by quoting it:
// it may hold a password.
func checkURLs(s string) (hasCreds bool, err error) {
	if s == "" {
		return false, nil
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		where := "the URL"
		if len(parts) > 1 {
			where = fmt.Sprintf("URL %d of %d", i+1, len(parts))
		}
		u, err := parseURL(p)
		if err != nil {
			return false, settingErr(FlagURL, ErrBadURL, "%s does not parse", where)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return false, settingErr(FlagURL, ErrBadURL, "%s has scheme %q: want nats, tls, ws or wss", where, u.Scheme)
		}
		if u.Hostname() == "" {
			return false, settingErr(FlagURL, ErrBadURL, "%s has no host", where)
		}
		if (u.User == nil && strings.Contains(p, "@")) || u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "" {
			return false, settingErr(FlagURL, ErrBadURL, "%s has a path, query or fragment: if its password holds '/', '?' or '#', percent-encode them", where)
		}
		if u.User != nil {
			hasCreds = true
			if pw, _ := u.User.Password(); pw == "xxxxx" || u.User.Username() == "redacted" {
				return false, settingErr(FlagURL, ErrBadURL, "%s holds the credentials placeholder --print-config shows, not the credentials", where)
			}
		}
	}
	return hasCreds, nil
}

// LogEvents returns connection options that log to log when the connection
// drops (warn) and when it is back (info, with the redacted server URL). A
// close by the program itself logs nothing.
func LogEvents(log zerolog.Logger) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed by us
				log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
	}
}
