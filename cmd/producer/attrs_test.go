package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAttributes: start --attr gives a run its attributes (repeatable),
// list --attr lists the runs with them (all of them, combined with the
// other filters) and shows them in an ATTRIBUTES column, and a bad
// attribute is refused before anything is stored.
func TestAttributes(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	for _, s := range []struct{ id, customer string }{{"a-1", "7"}, {"a-2", "8"}, {"a-3", "7"}} {
		code, _, errOut := producer("start", "greet", `{"name":"n"}`, "--id", s.id, "--attr", "order_id=42", "--attr", "customer="+s.customer)
		require.Equal(t, 0, code, errOut)
		code, _, errOut = producer("wait", s.id)
		require.Equal(t, 0, code, errOut)
	}
	code, _, errOut := producer("start", "greet", `{"name":"n"}`, "--id", "a-4", "--attr", "order_id=43")
	require.Equal(t, 0, code, errOut)

	require.Eventually(t, func() bool {
		return slices.Equal([]string{"a-3", "a-1"}, runIDs(listJSON(t, producer, "--attr", "order_id=42", "--attr", "customer=7")))
	}, 10*time.Second, 10*time.Millisecond)
	page := listJSON(t, producer, "--attr", "order_id=42", "--status", "completed", "--limit", "1")
	require.Equal(t, []string{"a-3"}, runIDs(page))
	require.Equal(t, map[string]string{"order_id": "42", "customer": "7"}, page.Runs[0].Attributes)
	require.NotEmpty(t, page.Next)

	code, out, errOut := producer("list", "--attr", "customer=8")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 2, out)
	require.Regexp(t, `^RUN ID\s+WORKFLOW\s+STATUS\s+UPDATED\s+CREATED\s+DUPLICATES\s+ATTRIBUTES$`, lines[0])
	require.Regexp(t, `^a-2\s+greet\s+completed\s+\S+\s+\S+\s+0\s+"customer=8,order_id=42"$`, lines[1])

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--attr", "order_id"}, "want NAME=VALUE"},
		{[]string{"list", "--attr", "Order=1"}, `attribute name "Order"`},
		{[]string{"list", "--attr", "a=1", "--attr", "a=2"}, "attribute a given twice"},
		{[]string{"list", "--counts", "--attr", "a=1"}, "--counts takes no --attr"},
		{[]string{"get", "a-1", "--attr", "a=1"}, "--attr is a flag of start and list, not get"},
		{[]string{"start", "greet", `{"name":"n"}`, "--id", "a-bad", "--attr", "order_id=" + strings.Repeat("4", 65)}, "order_id: value is 65 bytes"},
	} {
		code, _, errOut := producer(bad.args...)
		require.NotEqual(t, 0, code, bad.args)
		require.Contains(t, errOut, bad.want, bad.args)
	}
	code, _, _ = producer("get", "a-bad")
	require.Equal(t, 3, code, "a refused start stores nothing")
}
