package timeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// A wait whose timeout passed is an outcome the workflow handles, not a
// fault: its line says "timed out" with the reason, never "fatal error".
// A hook whose token another wait took, and a step that failed fatally,
// still say "fatal error".
func TestWaitTimeoutIsNotAFatalError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		step jetflow.StepRecord
		want string
	}{
		{"event timeout", jetflow.StepRecord{Kind: "event", WakeAt: at(10 * time.Second), Fatal: true,
			Code: jetflow.CodeEventTimeout, Error: "no event email-verified within 10s"},
			"timed out: no event email-verified within 10s"},
		{"hook timeout", jetflow.StepRecord{Kind: "hook", HookToken: "tok-1", WakeAt: at(time.Minute), Fatal: true,
			Code: jetflow.CodeEventTimeout, Error: "no event approved within 1m0s"},
			"hook (token tok-1); timed out: no event approved within 1m0s"},
		{"hook taken", jetflow.StepRecord{Kind: "hook", HookToken: "tok-1", Fatal: true,
			Code: jetflow.CodeHookTaken, Error: "hook token tok-1 is taken by run r-2 (step r-2.event=approved.0)"},
			"hook (token tok-1); fatal error: hook token tok-1 is taken by run r-2 (step r-2.event=approved.0)"},
		{"event", jetflow.StepRecord{Kind: "event", EventID: "evt-1"}, "event evt-1"},
		{"fatal step", jetflow.StepRecord{Fatal: true, Code: "card_declined", Error: "declined"}, "fatal error: declined"},
		{"escaped", jetflow.StepRecord{Kind: "event", Fatal: true, Code: jetflow.CodeEventTimeout, Error: "no event \x1b[31m within 1s"},
			`timed out: no event \x1b[31m within 1s`},
	} {
		require.Equal(t, tc.want, detail(tc.step), tc.name)
	}
}
