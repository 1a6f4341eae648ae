package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jetflow/jetflow"
)

// WelcomeWorkflow is the workflow's stable name: starts name it.
const WelcomeWorkflow = "welcome"

// Signup is the workflow's input: a user who just signed up.
type Signup struct {
	UserID string `json:"user_id"`
	Email  string `json:"email"`
}

// Welcomed is the workflow's output.
type Welcomed struct {
	UserID    string `json:"user_id"`
	ProfileID string `json:"profile_id"`
	// MessageID is the email provider's ID of the welcome email, and
	// IdempotencyKey the key it was sent under: the step's ID.
	MessageID      string `json:"message_id"`
	IdempotencyKey string `json:"idempotency_key"`
	Recorded       bool   `json:"recorded"`
}

// Email is the send-welcome-email step's committed result.
type Email struct {
	MessageID      string `json:"message_id"`
	IdempotencyKey string `json:"idempotency_key"`
}

// NewWelcomeWorkflow returns the welcome workflow: three steps, each run
// once per run whatever crashes and retries happen, their results
// committed. The email step sends with its step ID (StepDetailsFrom) as the
// Idempotency-Key, so that a retry after a lost response sends no second
// email.
func NewWelcomeWorkflow(mail *Outbox) *jetflow.Workflow[Signup, Welcomed] {
	return jetflow.NewWorkflow(WelcomeWorkflow, func(ctx *jetflow.Context, in Signup) (Welcomed, error) {
		if in.UserID == "" || !strings.Contains(in.Email, "@") {
			return Welcomed{}, jetflow.Fatal(errors.New("a signup needs a user_id and an email address"))
		}
		out := Welcomed{UserID: in.UserID}
		var err error
		out.ProfileID, err = jetflow.Step(ctx, "create-profile", func(context.Context) (string, error) {
			return "profile-" + in.UserID, nil // a real worker writes to its database here
		})
		if err != nil {
			return out, err
		}
		sent, err := jetflow.Step(ctx, "send-welcome-email", func(sctx context.Context) (Email, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			// A real worker POSTs to its email provider with the header
			// Idempotency-Key: info.StepID.
			return Email{MessageID: mail.Send(info.StepID, in.Email, "Welcome!"), IdempotencyKey: info.StepID}, nil
		})
		if err != nil {
			return out, err
		}
		out.MessageID, out.IdempotencyKey = sent.MessageID, sent.IdempotencyKey
		out.Recorded, err = jetflow.Step(ctx, "record-welcome", func(context.Context) (bool, error) {
			return true, nil // a real worker marks the user as welcomed
		})
		return out, err
	})
}

// Outbox stands in for an email provider that honours Idempotency-Key: a
// second send with a key returns the first send's message ID and sends
// nothing.
type Outbox struct {
	mu   sync.Mutex
	sent map[string]string // idempotency key -> message ID
}

// NewOutbox returns an empty outbox.
func NewOutbox() *Outbox { return &Outbox{sent: make(map[string]string)} }

// Send "sends" an email under key and returns its message ID.
func (o *Outbox) Send(key, _, _ string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if id, ok := o.sent[key]; ok {
		return id
	}
	id := fmt.Sprintf("msg-%d", len(o.sent)+1)
	o.sent[key] = id
	return id // a real provider would deliver subject to to
}
