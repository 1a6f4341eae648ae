package entry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/entry"
)

func TestWithFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Equal(t, entry.Point(""), entry.From(ctx), "a context without an entry point names none")
	for _, p := range []entry.Point{entry.SDK, entry.NATS, entry.HTTP, entry.Webhook} {
		require.Equal(t, p, entry.From(entry.With(ctx, p)))
	}
	inner := entry.With(entry.With(ctx, entry.HTTP), entry.Webhook)
	require.Equal(t, entry.Webhook, entry.From(inner), "the innermost setting wins")
}
