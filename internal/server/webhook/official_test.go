package webhook

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/webhooktest"
)

// TestOfficialLibraries: every delivery the providers' own libraries sign
// (standardwebhooks, @octokit/webhooks-methods and stripe-go) is judged as
// those libraries' verifiers judge it — rotation, tolerance, tampering and
// signature entries jetflow cannot parse beside a valid one — and every
// accepted event has a valid run ID, whatever its event ID looks like.
func TestOfficialLibraries(t *testing.T) {
	t.Parallel()
	cases, err := webhooktest.All()
	require.NoError(t, err)
	counts := map[string]int{}
	for _, c := range cases {
		counts[c.Provider]++
		t.Run(c.Provider+"/"+c.Name, func(t *testing.T) {
			t.Parallel()
			src := Source{Name: "src", Provider: Provider(c.Provider), Workflow: "w", Secrets: c.Secrets}
			ev, err := src.Verify(c.Header, c.Body, c.Now)
			want, differs := c.JetflowAccepts()
			if differs {
				require.NotEqual(t, want, c.Accepted, "the official verifier now agrees on %q: drop it from webhooktest's differences", c.Name)
			}
			if !want {
				require.Error(t, err, "the official verifier refuses this delivery")
				require.True(t, errors.Is(err, ErrBadSignature) || errors.Is(err, ErrMalformed) || errors.Is(err, ErrStaleTimestamp), "%v", err)
				require.Zero(t, ev)
				return
			}
			require.NoError(t, err, "the official verifier accepts this delivery")
			require.Equal(t, c.EventID, ev.ID)
			runID, err := src.RunID(ev)
			require.NoError(t, err)
			require.NoError(t, state.ValidateRunID(runID))
			if state.ValidateRunID("src-"+c.EventID) == nil && c.EventID[0] != '=' {
				require.Equal(t, "src-"+c.EventID, runID, "an event ID that fits is kept")
			} else {
				require.Regexp(t, `^src-=[A-Za-z0-9_-]{43}$`, runID, "an event ID that does not fit is hashed")
			}
		})
	}
	require.Len(t, counts, 3, "cases of every provider: %v", counts)
}
