package main

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/webhook"
)

// Secrets the webhook tests use; no error message may contain them.
var (
	stdSecret    = "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-secret-bytes-0123456789"))
	stdSecret2   = "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-secret-bytes-rotated-42"))
	stripeSecret = "whsec_stripe-inline-secret-5eb1"
	githubSecret = "gh-env-secret-a41c"
)

func TestLoadWebhooks(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "webhooks.yaml", `
# the sources of the test
- name: users
  provider: standard
  workflow: greet
  secret_env: [USERS_OLD, USERS_NEW]   # rotation
  tolerance: 2m
- name: stripe
  provider: stripe
  workflow: order
  secrets: ["`+stripeSecret+`"]
  attributes:
    order_id: /data/object/metadata/order_id
    customer: /data/object/customer
- name: gh
  provider: github
  workflow: sync
  secret_env: GH_SECRET
`)
	env := map[string]string{"USERS_OLD": stdSecret, "USERS_NEW": stdSecret2, "GH_SECRET": githubSecret}
	sources, err := loadWebhooks(path, func(k string) string { return env[k] })
	require.NoError(t, err)
	ptr := func(s string) webhook.Pointer {
		p, err := webhook.ParsePointer(s)
		require.NoError(t, err)
		return p
	}
	require.Equal(t, []webhook.Source{
		{Name: "users", Provider: webhook.Standard, Workflow: "greet", Secrets: []string{stdSecret, stdSecret2}, Tolerance: 2 * time.Minute},
		{Name: "stripe", Provider: webhook.Stripe, Workflow: "order", Secrets: []string{stripeSecret}, Attributes: map[string]webhook.Pointer{
			"order_id": ptr("/data/object/metadata/order_id"), "customer": ptr("/data/object/customer")}},
		{Name: "gh", Provider: webhook.GitHub, Workflow: "sync", Secrets: []string{githubSecret}},
	}, sources)
}

func TestLoadWebhooksErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"STD": stdSecret, "STD2": stdSecret2, "GH": githubSecret, "BLANK": "  "}
	for _, tc := range []struct {
		name   string
		file   string
		is     error
		want   []string // substrings of the message, besides the file's path
		noPath bool
	}{
		{"UnknownField", "- name: users\n  provider: standard\n  workflow: greet\n  secert_env: STD\n",
			errUnknownField, []string{`line 4: source "users": unknown field "secert_env"`}, false},
		{"MissingEnv", "- name: users\n  provider: standard\n  workflow: greet\n  secret_env: [STD, STD2, MISSING_SECRET]\n",
			errEmptySecretEnv, []string{`line 1: source "users": field secret_env: MISSING_SECRET: environment variable is empty`}, false},
		{"BlankEnv", "- name: gh\n  provider: github\n  workflow: sync\n  secret_env: BLANK\n",
			errEmptySecretEnv, []string{"BLANK"}, false},
		{"PrefixNames", "- name: stripe-eu\n  provider: github\n  workflow: w\n  secret_env: GH\n- name: stripe\n  provider: github\n  workflow: w\n  secret_env: GH\n",
			errNameCollision, []string{`line 1: source "stripe-eu": colliding source names`, `could equal those of "stripe" (line 5)`}, false},
		{"SameNames", "- name: a\n  provider: github\n  workflow: w\n  secret_env: GH\n- name: a\n  provider: github\n  workflow: w\n  secret_env: GH\n",
			errNameCollision, []string{`line 5: source "a": colliding source names: the name is used twice (also on line 1)`}, false},
		{"BadInlineSecret", "- name: users\n  provider: standard\n  workflow: greet\n  secrets: ['" + stripeSecret + "!!']\n",
			webhook.ErrInvalidSource, []string{`source "users"`}, false},
		{"BothSecretKinds", "- name: gh\n  provider: github\n  workflow: w\n  secret_env: GH\n  secrets: [" + githubSecret + "]\n",
			webhook.ErrInvalidSource, []string{"give secret_env or secrets, not both"}, false},
		{"NoSecret", "- name: gh\n  provider: github\n  workflow: w\n",
			webhook.ErrInvalidSource, []string{"needs secret_env (preferred) or secrets"}, false},
		{"SecretsMap", "- name: gh\n  provider: github\n  workflow: w\n  secrets: {k: " + githubSecret + "}\n",
			errWebhooksMalformed, []string{"field secrets: malformed webhooks file: want a string or a non-empty list of strings"}, false},
		{"SecretsNested", "- name: gh\n  provider: github\n  workflow: w\n  secrets: [[" + githubSecret + "]]\n",
			errWebhooksMalformed, []string{"field secrets: malformed webhooks file: item 0 must be a non-empty string"}, false},
		{"BadProvider", "- name: gh\n  provider: gitlab\n  workflow: w\n  secret_env: GH\n",
			webhook.ErrInvalidSource, []string{`source "gh"`, "gitlab"}, false},
		{"BadTolerance", "- name: gh\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  tolerance: soon\n",
			webhook.ErrInvalidSource, []string{`line 5: source "gh": field tolerance`, `"soon" is not a duration`}, false},
		{"RepeatedField", "- name: gh\n  provider: github\n  provider: stripe\n  workflow: w\n  secret_env: GH\n",
			errWebhooksMalformed, []string{"line 3", "field provider: malformed webhooks file: given twice"}, false},
		{"NotAList", "name: gh\nprovider: github\n", errWebhooksMalformed, []string{"want a list of sources"}, false},
		{"Empty", "", errWebhooksMalformed, []string{"no sources"}, false},
		{"TwoDocuments", "- name: a\n---\n- name: b\n", errWebhooksMalformed, []string{"want one YAML document"}, false},
		{"NotYAML", "- name: [\n", errWebhooksMalformed, nil, false},
		{"Missing", "", nil, []string{"no such file"}, true},
		{"ResumeBadTemplate", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume:\n    - type: payment_intent.succeeded\n      token: order.{data.id}\n",
			webhook.ErrInvalidSource, []string{`line 7: source "s": field resume, item 0`, `'.' cannot be part of a hook token`}, false},
		{"ResumeNoPlaceholder", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume:\n    - {type: t, token: order-1}\n",
			webhook.ErrInvalidSource, []string{"line 6", "no {field} placeholder"}, false},
		{"ResumeNoToken", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume:\n    - type: t\n",
			webhook.ErrInvalidSource, []string{"field resume, item 0", "token is required"}, false},
		{"ResumeUnknownKey", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume:\n    - {type: t, token: 'x-{id}', path: y}\n",
			errUnknownField, []string{`unknown field "path" (want one of type, token)`}, false},
		{"ResumeNotAList", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume: {type: t}\n",
			errWebhooksMalformed, []string{"field resume", "want a non-empty list"}, false},
		{"ResumeGitHub", "- name: s\n  provider: github\n  workflow: w\n  secret_env: GH\n  resume:\n    - {type: push, token: 'x-{id}'}\n",
			webhook.ErrInvalidSource, []string{"GitHub does not sign the event type"}, false},
		{"AttributesNotAMap", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  attributes: [order_id]\n",
			errWebhooksMalformed, []string{"line 5", "field attributes", "want a map of attribute name to JSON pointer"}, false},
		{"AttributeBadPointer", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  attributes:\n    order_id: data.order\n",
			webhook.ErrInvalidSource, []string{"line 6", "field attributes: order_id", `JSON pointer "data.order"`}, false},
		{"AttributeBadName", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  attributes:\n    Order: /order\n",
			webhook.ErrInvalidSource, []string{`attribute name "Order"`}, false},
		{"ResumeTypeTwice", "- name: s\n  provider: stripe\n  workflow: w\n  secret_env: GH\n  resume:\n    - {type: t, token: 'x-{id}'}\n    - {type: t, token: 'y-{id}'}\n",
			webhook.ErrInvalidSource, []string{`event type "t" is given twice`}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, "hooks.yaml", tc.file)
			if tc.noPath {
				path += ".missing"
			}
			_, err := loadWebhooks(path, func(k string) string { return env[k] })
			require.Error(t, err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "webhooks file "+path), msg)
			for _, want := range tc.want {
				require.Contains(t, msg, want)
			}
			for _, secret := range []string{stdSecret, stdSecret2, stripeSecret, githubSecret} {
				require.NotContains(t, msg, secret)
			}
		})
	}
}

// TestServeWebhooksFileError: serve refuses a bad --webhooks file before
// it connects to anything, and says why without the secret.
func TestServeWebhooksFileError(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "hooks.yaml", "- name: users\n  provider: standard\n  workflow: greet\n  secrets: ['"+stripeSecret+"!!']\n  colour: blue\n")
	code, out, errOut := runNoServer(t, map[string]string{"JETFLOW_NATS_URL": "nats://127.0.0.1:1"},
		"serve", "--webhooks", path, "--log-format", "json")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, `unknown field \"colour\"`)
	require.Contains(t, errOut, path)
	require.NotContains(t, errOut, "stripe-inline-secret")
	require.NotContains(t, errOut, "nats://", "it fails before connecting")
}

// The example file in deploy/ loads, with its secrets from the environment.
func TestLoadWebhooksExample(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"STRIPE_WEBHOOK_SECRET": stripeSecret, "GITHUB_WEBHOOK_SECRET": githubSecret,
		"GITHUB_WEBHOOK_SECRET_OLD": githubSecret + "-old", "USERS_WEBHOOK_SECRET": stdSecret,
	}
	sources, err := loadWebhooks("../../deploy/webhooks.example.yaml", func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Len(t, sources, 3)
	for _, s := range sources {
		require.NoError(t, s.Validate())
		require.Equal(t, "order", s.Workflow, "the example worker serves order")
	}
	require.Equal(t, []string{githubSecret, githubSecret + "-old"}, sources[1].Secrets)

	// Stripe's payment_intent.succeeded resumes the order's payment hook.
	require.Len(t, sources[0].Resume, 1)
	rule, ok := sources[0].ResumeFor(webhook.Event{ID: "evt_1", Type: "payment_intent.succeeded"})
	require.True(t, ok)
	token, err := rule.Token.Token([]byte(`{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"metadata":{"order_id":"o-42"}}}}`))
	require.NoError(t, err)
	require.Equal(t, "order-o-42-payment", token)
	_, ok = sources[0].ResumeFor(webhook.Event{ID: "evt_2", Type: "charge.refunded"})
	require.False(t, ok, "other types start the workflow")
}
