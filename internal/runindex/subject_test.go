package runindex

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// Every filter a page takes matches exactly the entries it selects, as
// the server matches subjects: a prefix matches the run ID equal to it and
// longer ones, never a run ID that only contains it.
func TestFiltersMatchTheirEntries(t *testing.T) {
	t.Parallel()
	entries := map[string]string{
		"order-1":  entrySubject(state.StatusCompleted, "orders", "order-1"),
		"order-12": entrySubject(state.StatusFailed, "orders", "order-12"),
		"order-2":  entrySubject(state.StatusRunning, "billing", "order-2"),
		"x-order":  entrySubject(state.StatusCompleted, "orders", "x-order"),
	}
	for _, tc := range []struct {
		q    Query
		want []string
	}{
		{Query{}, []string{"order-1", "order-12", "order-2", "x-order"}},
		{Query{Status: state.StatusCompleted}, []string{"order-1", "x-order"}},
		{Query{Workflow: "orders"}, []string{"order-1", "order-12", "x-order"}},
		{Query{Prefix: "order-1"}, []string{"order-1", "order-12"}},
		{Query{Prefix: "order-12"}, []string{"order-12"}},
		{Query{Prefix: "order-123"}, nil},
		{Query{Prefix: "order", Workflow: "billing"}, []string{"order-2"}},
		{Query{Prefix: "order-1", Status: state.StatusFailed, Workflow: "orders"}, []string{"order-12"}},
	} {
		var got []string
		for id, subj := range entries {
			if server.SubjectMatchesFilter(subj, tc.q.filter()) {
				got = append(got, id)
			}
		}
		require.ElementsMatch(t, tc.want, got, "%+v: filter %s", tc.q, tc.q.filter())
	}
	require.True(t, server.SubjectMatchesFilter(entries["order-1"], runFilter("order-1")))
	require.False(t, server.SubjectMatchesFilter(entries["order-12"], runFilter("order-1")))
}

// A cursor reads back only as a page wrote it.
func TestCursor(t *testing.T) {
	t.Parallel()
	seq, err := ParseCursor(EncodeCursor(42))
	require.NoError(t, err)
	require.Equal(t, uint64(42), seq)
	seq, err = ParseCursor("")
	require.NoError(t, err)
	require.Zero(t, seq)
	for _, bad := range []string{"42", "c", "c0", "c-1", "c042", "c1 ", "cx"} {
		_, err := ParseCursor(bad)
		require.Error(t, err, bad)
	}
}
