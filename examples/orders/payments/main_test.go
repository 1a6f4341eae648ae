package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun: the command serves until its context ends and exits 0; bad
// arguments and an unreadable ledger exit 1 before serving.
func TestRun(t *testing.T) {
	t.Parallel()
	ledger := filepath.Join(t.TempDir(), "ledger.jsonl")
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"extra"},
		{"--addr", "127.0.0.1:0", "--ledger", t.TempDir()}, // a directory
	} {
		require.Equal(t, 1, run(t.Context(), args, io.Discard), args)
	}

	ctx, cancel := context.WithCancel(t.Context())
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	code := make(chan int, 1)
	go func() {
		defer w.Close()
		code <- run(ctx, []string{"--addr", "127.0.0.1:0", "--ledger", ledger}, w)
	}()
	var started struct {
		Message string `json:"message"`
		URL     string `json:"url"`
		Charges int    `json:"charges"`
	}
	sc := bufio.NewScanner(r)
	require.True(t, sc.Scan(), "a first log line")
	require.NoError(t, json.Unmarshal(sc.Bytes(), &started))
	require.Equal(t, "payment service started", started.Message)
	require.Contains(t, started.URL, "http://127.0.0.1:")
	cancel()
	require.Equal(t, 0, <-code)
	_, err = os.Stat(ledger)
	require.NoError(t, err, "the ledger file is created")
}
