package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jetflow/jetflow/internal/state"
)

// Provider is a signature scheme.
type Provider string

// The supported schemes; see the package documentation.
const (
	// Standard is Standard Webhooks: webhook-id, webhook-timestamp,
	// webhook-signature.
	Standard Provider = "standard"
	// GitHub is GitHub's scheme: X-GitHub-Delivery, X-Hub-Signature-256,
	// X-GitHub-Event.
	GitHub Provider = "github"
	// Stripe is Stripe's scheme: Stripe-Signature (t=..,v1=..), with the
	// event id and type in the JSON body.
	Stripe Provider = "stripe"
)

// DefaultTolerance is the clock skew a timestamped delivery may have when
// Source.Tolerance is zero.
const DefaultTolerance = 5 * time.Minute

// standardPrefix starts a Standard Webhooks secret.
const standardPrefix = "whsec_"

// Source is one configured webhook source: deliveries to
// /v1/webhooks/<Name> start Workflow, or resume a hook (Resume).
//
// Formatting a Source with any fmt verb, String, GoString or MarshalJSON
// shows how many secrets it has, never what they are.
type Source struct {
	// Name is the URL segment and the run ID prefix: 1..64 characters of
	// [A-Za-z0-9_-]. No source's name should be another's followed by '-',
	// or their run IDs could meet (see RunID).
	Name     string
	Provider Provider
	// Workflow is the workflow started for each event.
	Workflow string
	// Secrets are one or more signing secrets; a delivery signed with any
	// of them is accepted (rotation). For Standard each is "whsec_" +
	// base64, or base64 alone.
	Secrets []string
	// Tolerance is the largest clock skew accepted for timestamped schemes
	// (Standard, Stripe), DefaultTolerance when zero. GitHub has no
	// timestamp.
	Tolerance time.Duration
	// Resume lists the event types that resume a hook instead of starting
	// Workflow (see Resume); events of other types start Workflow. Not for
	// GitHub, which does not sign the event type.
	Resume []Resume
	// Attributes name the attributes of each run the source starts
	// (jetflow.WithAttributes) and where in the event's payload each is
	// read (AttributesOf): at most 8, by attribute name.
	Attributes map[string]Pointer
}

// Validate reports the first bad field as ErrInvalidSource, naming the
// field (Secrets by index); the message never includes a secret.
func (s Source) Validate() error {
	if err := state.ValidateName(s.Name); err != nil {
		return fmt.Errorf("%w: Name: %w", ErrInvalidSource, err)
	}
	switch s.Provider {
	case Standard, GitHub, Stripe:
	default:
		return fmt.Errorf("%w: Provider %q is not %q, %q or %q",
			ErrInvalidSource, clip(string(s.Provider)), Standard, GitHub, Stripe)
	}
	if err := state.ValidateName(s.Workflow); err != nil {
		return fmt.Errorf("%w: Workflow: %w", ErrInvalidSource, err)
	}
	if len(s.Secrets) == 0 {
		return fmt.Errorf("%w: Secrets: none given", ErrInvalidSource)
	}
	if err := validateAttributes(s.Attributes); err != nil {
		return err
	}
	if _, err := s.keys(); err != nil {
		return err
	}
	if s.Tolerance < 0 {
		return fmt.Errorf("%w: Tolerance %v is negative", ErrInvalidSource, s.Tolerance)
	}
	return s.validateResume()
}

// RunID is the run ID a delivery of ev starts, the same for the same
// source and event ID, which is what makes a re-delivered event land on its
// first run. Any non-empty event ID has one:
//
//   - "<Name>-<ev.ID>" when that is a valid run ID (1..128 characters of
//     [A-Za-z0-9_=-] in all) and ev.ID does not start with "=";
//   - otherwise "<Name>-=" followed by the unpadded base64url SHA-256 of
//     ev.ID (43 characters), for an ID with a character such as '.' or ':',
//     or too long to be kept as it is.
//
// Distinct event IDs of a source get distinct run IDs: kept IDs are
// distinct as they are and never start with "=", hashed ones always do
// (and differ unless SHA-256 collides). Only an empty event ID is an error
// (ErrMalformed, also matching state.ErrInvalidRunID); Verify never returns
// an Event with one.
func (s Source) RunID(ev Event) (string, error) {
	if err := state.ValidateName(s.Name); err != nil {
		return "", fmt.Errorf("%w: Name: %w", ErrInvalidSource, err)
	}
	if ev.ID == "" {
		return "", fmt.Errorf("%w: %w: empty event ID", ErrMalformed, state.ErrInvalidRunID)
	}
	prefix := s.Name + "-"
	if !strings.HasPrefix(ev.ID, hashedMark) && state.ValidateRunID(prefix+ev.ID) == nil {
		return prefix + ev.ID, nil
	}
	sum := sha256.Sum256([]byte(ev.ID))
	return prefix + hashedMark + base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// hashedMark starts the event part of a run ID made from a hash (RunID).
const hashedMark = "="

// RunSource is the source a delivery of ev records on the run it starts
// and in the audit of each duplicate delivery:
// "webhook:<Name>:<event ID>", so that the original event ID stays on the
// run also when RunID had to hash it. An event ID with a byte outside
// printable ASCII is recorded Go-quoted (strconv.QuoteToASCII); one that
// would make the source longer than state.MaxSourceLen (256) is clipped,
// ending in "...", and is whole only in the HTTP reply (and, for Stripe, in
// the body).
func (s Source) RunSource(ev Event) string {
	prefix := s.sourcePrefix()
	id := ev.ID
	for _, c := range []byte(id) {
		if c < 0x20 || c > 0x7e {
			id = strconv.QuoteToASCII(id)
			break
		}
	}
	if room := state.MaxSourceLen - len(prefix); len(id) > room {
		id = id[:room-len("...")] + "..."
	}
	return prefix + id
}

// StartedRun reports whether runSource, the source recorded on a run, is
// one a delivery of s records: RunSource's "webhook:<Name>:..." or, on runs
// started before event IDs were recorded, "webhook:<Name>".
func (s Source) StartedRun(runSource string) bool {
	prefix := s.sourcePrefix()
	return runSource == strings.TrimSuffix(prefix, ":") || strings.HasPrefix(runSource, prefix)
}

// sourcePrefix is "webhook:<Name>:".
func (s Source) sourcePrefix() string {
	return "webhook:" + s.Name + ":"
}

// tolerance is the effective Tolerance.
func (s Source) tolerance() time.Duration {
	if s.Tolerance == 0 {
		return DefaultTolerance
	}
	return s.Tolerance
}

// keys returns the HMAC keys of s's secrets, or ErrInvalidSource naming
// the first bad one by index.
func (s Source) keys() ([][]byte, error) {
	keys := make([][]byte, len(s.Secrets))
	for i, secret := range s.Secrets {
		key, err := s.key(secret)
		if err != nil {
			return nil, fmt.Errorf("%w: Secrets[%d]: %w", ErrInvalidSource, i, err)
		}
		keys[i] = key
	}
	return keys, nil
}

// key returns the HMAC key of one of s's secrets.
func (s Source) key(secret string) ([]byte, error) {
	if s.Provider == Standard {
		return standardKey(secret)
	}
	if secret == "" {
		return nil, errors.New("empty")
	}
	return []byte(secret), nil
}

// standardKey decodes a Standard Webhooks secret: "whsec_" (optional)
// followed by base64, padded or not. The error never quotes the secret.
func standardKey(secret string) ([]byte, error) {
	b64 := strings.TrimPrefix(secret, standardPrefix)
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(b64)
	}
	switch {
	case err != nil:
		return nil, errors.New("not base64 after the optional whsec_ prefix")
	case len(key) == 0:
		return nil, errors.New("empty key")
	}
	return key, nil
}

// String describes s with its secrets redacted.
func (s Source) String() string {
	return fmt.Sprintf("{Name:%s Provider:%s Workflow:%s Secrets:%s Tolerance:%v}",
		s.Name, s.Provider, s.Workflow, redacted(len(s.Secrets)), s.Tolerance)
}

// GoString describes s in Go syntax (for %#v) with its secrets redacted.
func (s Source) GoString() string {
	return fmt.Sprintf("webhook.Source{Name:%q, Provider:%q, Workflow:%q, Secrets:[]string{/* %d redacted */}, Tolerance:%d}",
		s.Name, s.Provider, s.Workflow, len(s.Secrets), int64(s.Tolerance))
}

// Format makes every fmt verb print the redacted String (GoString for %#v),
// so no verb can print a secret.
func (s Source) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, s.GoString())
		return
	}
	_, _ = fmt.Fprintf(f, fmt.FormatString(f, verb), s.String())
}

// MarshalJSON encodes s for logs with its secrets replaced by a count. The
// result does not decode back into a Source (secrets is a string there), so
// a logged config cannot be reloaded as one with bogus secrets.
func (s Source) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name      string   `json:"name"`
		Provider  Provider `json:"provider"`
		Workflow  string   `json:"workflow"`
		Secrets   string   `json:"secrets"`
		Tolerance string   `json:"tolerance"`
	}{s.Name, s.Provider, s.Workflow, redacted(len(s.Secrets)), s.Tolerance.String()})
}

func redacted(n int) string {
	return fmt.Sprintf("[%d redacted]", n)
}

// clip shortens a value quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
