package startproto

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
)

// A durable envelope is acknowledged once admission decided, terminated when
// it can never be admitted, and delivered again after an infrastructure
// error — except when its start overlapped its run's whole life
// (dedupe.ErrRetryStart): admitting it again would create a run nobody asked for.
func TestDurableSettlement(t *testing.T) {
	t.Parallel()
	internal := func(err error) StartReply {
		return StartReply{Error: &ReplyError{Code: CodeInternal, Message: err.Error()}, cause: err}
	}
	for name, tc := range map[string]struct {
		reply StartReply
		want  settlement
	}{
		"created":     {StartReply{Outcome: "created"}, settleAck},
		"conflict":    {StartReply{Error: &ReplyError{Code: CodeConflict}}, settleAck},
		"rejected":    {StartReply{Error: &ReplyError{Code: CodeRejected}}, settleAck},
		"malformed":   {StartReply{Error: &ReplyError{Code: CodeMalformed}}, settleTerm},
		"invalid id":  {StartReply{Error: &ReplyError{Code: CodeInvalidRunID}}, settleTerm},
		"nats error":  {internal(errors.New("nats: timeout")), settleRetry},
		"retry start": {internal(fmt.Errorf("jetflow: start r: %w", dedupe.ErrRetryStart)), settleAck},
	} {
		require.Equal(t, tc.want, settle(tc.reply), name)
	}
}
