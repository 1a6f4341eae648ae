// Package webhook checks jetflow's Stripe fixtures against stripe-go:
// internal/testsupport/webhooktest/testdata/stripe.json holds deliveries
// stripe-go signed and stripe-go's verdict on each, which the tests of
// internal/server/webhook and internal/server/httpapi hold jetflow's
// verifier to. Its test signs them again with stripe-go and fails unless
// the file is what stripe-go gives today; `go test ./webhook -update`
// writes it anew.
package webhook
