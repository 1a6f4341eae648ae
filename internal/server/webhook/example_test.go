package webhook_test

import (
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/server/webhook"
)

// A GitHub delivery is verified and mapped to its run ID; a re-delivery of
// the same event gets the same run ID, so it lands on the same run.
func ExampleSource_Verify() {
	src := webhook.Source{
		Name:     "github",
		Provider: webhook.GitHub,
		Workflow: "on-push",
		Secrets:  []string{"new-secret", "old-secret"}, // rotating
	}
	body := []byte(`{"ref":"refs/heads/main"}`)
	now := time.Now()
	h := webhook.Sign(webhook.GitHub, "old-secret", "72d3162e-cc78-11e3-81ab-4c9367dc0958", now, body)
	h.Set("X-GitHub-Event", "push")

	ev, err := src.Verify(h, body, now)
	if err != nil {
		fmt.Println(err)
		return
	}
	runID, err := src.RunID(ev)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ev.Type, runID)
	fmt.Println(src)

	_, err = src.Verify(h, []byte(`{"ref":"refs/heads/evil"}`), now)
	fmt.Println(err)
	// Output:
	// push github-72d3162e-cc78-11e3-81ab-4c9367dc0958
	// {Name:github Provider:github Workflow:on-push Secrets:[2 redacted] Tolerance:0s}
	// webhook: bad signature: X-Hub-Signature-256 does not match
}

// Every event ID has a run ID: one that fits is kept, any other is hashed,
// never refused.
func ExampleSource_RunID() {
	src := webhook.Source{Name: "users", Provider: webhook.Standard, Workflow: "on-user"}
	for _, id := range []string{"msg_2Lx0a9", "msg.1"} {
		runID, err := src.RunID(webhook.Event{ID: id})
		fmt.Println(runID, err)
	}
	fmt.Println(src.RunSource(webhook.Event{ID: "msg.1"}))
	// Output:
	// users-msg_2Lx0a9 <nil>
	// users-=8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4 <nil>
	// webhook:users:msg.1
}
