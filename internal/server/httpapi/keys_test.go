package httpapi

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/jetflow/jetflow"
	"github.com/stretchr/testify/require"
)

// DELETE /v1/task-keys/{key} forgets a task key: the next step call with
// it runs again; a repeat reset deletes nothing.
func TestResetTaskKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "welcome/u1" // a slash, sent as %2F
	path := "/v1/task-keys/" + url.PathEscape(key) + "?scope=global"

	require.Equal(t, http.StatusCreated, b.post("mailer", "mail-1", `"`+key+`"`).code)
	b.waitDone("mail-1")
	require.Equal(t, http.StatusCreated, b.post("mailer", "mail-2", `"`+key+`"`).code)
	b.waitDone("mail-2")
	require.EqualValues(t, 1, b.sends.Load(), "the second run was served from the key")
	// The served step says so, and which step's result it got.
	res := b.do(http.MethodGet, "/v1/runs/mail-2", nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	var run jetflow.RunDescription
	res.json(t, &run)
	require.Len(t, run.Steps, 1)
	require.NotNil(t, run.Steps[0].TaskKey, "body: %s", res.body)
	require.True(t, run.Steps[0].TaskKey.Served)
	require.Equal(t, "mail-1."+run.Steps[0].Name+".0", run.Steps[0].TaskKey.From)

	res = b.do(http.MethodDelete, path, nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	require.Empty(t, res.header.Values("Deprecation"), "the current name is not deprecated")
	var out KeyReset
	res.json(t, &out)
	require.Equal(t, KeyReset{Key: key, Scope: "global", Deleted: 1}, out)

	res = b.do(http.MethodDelete, path, nil, "")
	require.Equal(t, http.StatusOK, res.code)
	res.json(t, &out)
	require.Equal(t, 0, out.Deleted, "a repeat deletes nothing")

	require.Equal(t, http.StatusCreated, b.post("mailer", "mail-3", `"`+key+`"`).code)
	b.waitDone("mail-3")
	require.EqualValues(t, 2, b.sends.Load(), "after the reset the step ran again")

	res = b.do(http.MethodDelete, "/v1/task-keys/k?scope=workflow&workflow=mailer", nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	res.json(t, &out)
	require.Equal(t, KeyReset{Key: "k", Scope: "workflow", Workflow: "mailer"}, out)
	res = b.do(http.MethodDelete, "/v1/task-keys/k?scope=run&run_id=mail-1", nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)

	for _, q := range []string{
		"", "scope=everything", "scope=workflow", "scope=run", "scope=global&workflow=mailer",
		"scope=run&run_id=bad%20id", "scope=workflow&workflow=a.b", "scope=run&run_id=r&workflow=w",
	} {
		res := b.do(http.MethodDelete, "/v1/task-keys/k?"+q, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, q)
		res.problem(t)
	}
}

// DELETE /v1/idempotency-keys/{key}, the reset's first name, is the same
// handler with a Deprecation header on every answer.
func TestResetTaskKeyDeprecatedAlias(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "welcome/u2"
	require.Equal(t, http.StatusCreated, b.post("mailer", "alias-1", `"`+key+`"`).code)
	b.waitDone("alias-1")
	require.EqualValues(t, 1, b.sends.Load())

	res := b.do(http.MethodDelete, "/v1/idempotency-keys/"+url.PathEscape(key)+"?scope=global", nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	require.Equal(t, "true", res.header.Get("Deprecation"))
	var out KeyReset
	res.json(t, &out)
	require.Equal(t, KeyReset{Key: key, Scope: "global", Deleted: 1}, out)

	require.Equal(t, http.StatusCreated, b.post("mailer", "alias-2", `"`+key+`"`).code)
	b.waitDone("alias-2")
	require.EqualValues(t, 2, b.sends.Load(), "after the reset the step ran again")

	res = b.do(http.MethodDelete, "/v1/idempotency-keys/k?scope=everything", nil, "")
	require.Equal(t, http.StatusBadRequest, res.code)
	require.Equal(t, "true", res.header.Get("Deprecation"), "on errors too")
	res.problem(t)
}
