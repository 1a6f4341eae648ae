package jetflowtype

import (
	"errors"
	"fmt"
	"testing"
)

// The texts are part of the API (and a step's is stored with its run):
// they are pinned here.
func TestErrorTexts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&ConflictError{RunID: "r", Field: "input", Stored: "ab", Requested: "cd"},
			`jetflow: idempotency conflict: run r exists with input "ab", the start asked for "cd": input differs`},
		{&ConflictError{RunID: "r", Field: "input", Stored: "ab", Requested: "cd",
			Fields: []FieldDiff{{"amount", FieldChanged}, {"coupon", FieldAdded}, {"note\n", FieldRemoved}}},
			`jetflow: idempotency conflict: run r exists with input "ab", the start asked for "cd": input fields differ: "amount" (changed), "coupon" (added), "note\n" (removed)`},
		{&ConflictError{RunID: "r", Field: "input", Stored: "ab", Requested: "cd", Fields: []FieldDiff{{"a", FieldChanged}}, MoreFields: 2},
			`jetflow: idempotency conflict: run r exists with input "ab", the start asked for "cd": input fields differ: "a" (changed), and 2 more`},
		{&ConflictError{RunID: "r", Field: "workflow", Stored: "order", Requested: "refund"},
			`jetflow: idempotency conflict: run r exists with workflow "order", the start asked for "refund"`},
		{&RejectedError{RunID: "r", Status: StatusCompleted},
			"jetflow: run r exists (completed) and the conflict policy rejects a duplicate start"},
		{&StepError{StepName: "charge", StepID: "r.charge.0", Attempts: 3, Message: "declined"},
			"jetflow: step charge (r.charge.0) failed after 3 attempt(s): declined"},
		{&StepError{StepName: "charge", StepID: "r.charge.0", Attempts: 1, Fatal: true, Message: "declined"},
			"jetflow: step charge (r.charge.0) failed fatally after 1 attempt(s): declined"},
		// A wait's timeout is not a fatal error.
		{&StepError{StepName: "event=paid", StepID: "r.event=paid.0", Attempts: 1, Fatal: true, Code: CodeEventTimeout, Message: "no event paid within 10s"},
			"jetflow: step event=paid (r.event=paid.0) timed out: no event paid within 10s"},
		{&StepError{StepName: "event=paid", StepID: "r.event=paid.0", Attempts: 1, Fatal: true, Code: CodeHookTaken, Message: "hook token t is taken"},
			"jetflow: step event=paid (r.event=paid.0) failed fatally after 1 attempt(s): hook token t is taken"},
		{&CodedError{Code: "card_declined", Err: errors.New("declined")}, "card_declined: declined"},
		{&CodedError{Code: "card_declined"}, "card_declined: <nil>"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%T: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// Each typed error matches its sentinel, wrapped or not, and nothing else.
func TestErrorsMatchTheirSentinels(t *testing.T) {
	t.Parallel()
	sentinels := []error{ErrIdempotencyConflict, ErrDuplicateRejected, ErrStepFailed, ErrEventTimeout, ErrHookTaken}
	for _, tc := range []struct {
		err  error
		want []error
	}{
		{&ConflictError{}, []error{ErrIdempotencyConflict}},
		{&RejectedError{}, []error{ErrDuplicateRejected}},
		{&StepError{StepName: "charge"}, []error{ErrStepFailed}},
		{&StepError{StepName: "charge", Code: CodeEventTimeout}, []error{ErrStepFailed}},
		{&StepError{StepName: "paid=0", Code: CodeEventTimeout}, []error{ErrStepFailed, ErrEventTimeout}},
		{&StepError{StepName: "paid=0", Code: CodeHookTaken}, []error{ErrStepFailed, ErrHookTaken}},
	} {
		for _, err := range []error{tc.err, fmt.Errorf("wrapped: %w", tc.err)} {
			for _, s := range sentinels {
				want := false
				for _, w := range tc.want {
					want = want || w == s
				}
				if errors.Is(err, s) != want {
					t.Errorf("errors.Is(%#v, %q) = %v", tc.err, s, !want)
				}
			}
		}
	}
}

// A step failure with a code unwraps to a *CodedError with the committed
// message; one without a code unwraps to nothing.
func TestStepErrorUnwrapsToItsCode(t *testing.T) {
	t.Parallel()
	se := &StepError{Code: "card_declined", Message: "declined"}
	var coded *CodedError
	if !errors.As(fmt.Errorf("w: %w", se), &coded) || coded.Code != "card_declined" || coded.Error() != "card_declined: declined" {
		t.Fatalf("errors.As reached %#v", coded)
	}
	if (&StepError{Message: "x"}).Unwrap() != nil {
		t.Fatal("a step failure without a code unwraps to something")
	}
}
