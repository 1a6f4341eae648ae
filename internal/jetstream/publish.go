package jetstream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Dedup says which line of defence absorbed a task publish, if any.
type Dedup int

const (
	// Stored: the task is new and stored.
	Stored Dedup = iota
	// DuplicateMsgID: the broker's Nats-Msg-Id window already had this ID.
	DuplicateMsgID
	// PendingSubject: a task for the same subject is still pending (not yet
	// acknowledged), so this one was refused. Durable beyond the window.
	PendingSubject
)

func (d Dedup) String() string {
	switch d {
	case DuplicateMsgID:
		return "duplicate-msg-id"
	case PendingSubject:
		return "pending-subject"
	default:
		return "stored"
	}
}

// PublishTask stores a task on subject with Nats-Msg-Id msgID. A duplicate
// publish is not an error: the result says which layer absorbed it. On a
// replicated stream a duplicate racing its original's replication is
// retried until ctx ends.
func PublishTask(ctx context.Context, js natsjs.JetStream, subject, msgID string, data []byte) (Dedup, error) {
	d, _, err := PublishTaskSeq(ctx, js, subject, msgID, data)
	return d, err
}

// PublishTaskSeq is PublishTask that also returns the stream sequence the
// broker answered with: the task's when it was stored, the message's that
// holds msgID when it was a duplicate (DuplicateMsgID; that message may be
// on another subject, see TaskAt), 0 when the subject's task refused it
// (PendingSubject).
func PublishTaskSeq(ctx context.Context, js natsjs.JetStream, subject, msgID string, data []byte) (Dedup, uint64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	wait := 10 * time.Millisecond
	for {
		ack, err := js.PublishMsg(ctx, msg, natsjs.WithMsgID(msgID), natsjs.WithExpectStream(TasksStream))
		switch {
		case err == nil && ack.Duplicate:
			return DuplicateMsgID, ack.Sequence, nil
		case err == nil:
			return Stored, ack.Sequence, nil
		case isPerSubjectLimit(err):
			return PendingSubject, 0, nil
		case isMsgIDInProcess(err):
			select {
			case <-ctx.Done():
				return Stored, 0, fmt.Errorf("jetflow: publish task %s: %w", subject, err)
			case <-time.After(wait):
			}
			wait = min(2*wait, 250*time.Millisecond)
		default:
			return Stored, 0, fmt.Errorf("jetflow: publish task %s: %w", subject, err)
		}
	}
}

// TaskAt returns the subject of the task stored at stream sequence seq in
// the task stream, as its leader has it: "" when no message is stored
// there (never, or acknowledged and removed since).
func TaskAt(ctx context.Context, js natsjs.JetStream, seq uint64) (string, error) {
	m, err := leaderMsg(ctx, js.Conn(), TasksStream, struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return "", Unavailable(fmt.Errorf("jetflow: read task %d: %w", seq, err))
	}
	return m.Subject, nil
}

// PendingTask returns the stream sequence and the body of the task pending
// on subject in the task stream, as its leader has it (0, nil: none).
func PendingTask(ctx context.Context, js natsjs.JetStream, subject string) (uint64, []byte, error) {
	st, err := leaderLast(ctx, js.Conn(), TasksStream, subject)
	if err != nil {
		return 0, nil, Unavailable(fmt.Errorf("jetflow: read the task pending on %s: %w", subject, err))
	}
	return st.Rev, st.Value, nil
}
