package opcluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The shipped configs are rendered with only their addresses and store
// directories changed: every other line is the shipped one, and the
// accounts file is copied byte for byte next to them.
func TestRenderConfigsRewritesOnlyAddressesAndStore(t *testing.T) {
	t.Parallel()
	src := filepath.Join("..", "..", "..", "deploy", "nats")
	dst := t.TempDir()
	ports := [Size]Ports{{4001, 8001, 6001}, {4002, 8002, 6002}, {4003, 8003, 6003}}
	stores := [Size]string{"/s/1", "/s/2", "/s/3"}
	files, err := RenderConfigs(src, dst, ports, stores)
	require.NoError(t, err)

	shippedAccounts, err := os.ReadFile(filepath.Join(src, "accounts.conf"))
	require.NoError(t, err)
	accounts, err := os.ReadFile(filepath.Join(dst, "accounts.conf"))
	require.NoError(t, err)
	require.Equal(t, shippedAccounts, accounts)

	for i, f := range files {
		shipped, err := os.ReadFile(filepath.Join(src, "cluster", NodeName(i)+".conf"))
		require.NoError(t, err)
		got, err := os.ReadFile(f)
		require.NoError(t, err)
		conf := string(got)
		require.NotContains(t, conf, "0.0.0.0")
		require.Contains(t, conf, "listen: 127.0.0.1:"+strconv.Itoa(ports[i].Client))
		require.Contains(t, conf, "http: 127.0.0.1:"+strconv.Itoa(ports[i].Monitor))
		require.Contains(t, conf, "listen: 127.0.0.1:"+strconv.Itoa(ports[i].Route))
		require.Contains(t, conf, `store_dir: "`+stores[i]+`"`)
		for j := range Size {
			require.Contains(t, conf, "nats-route://127.0.0.1:"+strconv.Itoa(ports[j].Route))
		}
		require.Contains(t, conf, "include ../accounts.conf")
		// Line by line, only the six rewritten lines differ.
		a, b := strings.Split(string(shipped), "\n"), strings.Split(conf, "\n")
		require.Len(t, b, len(a))
		changed := 0
		for k := range a {
			if a[k] != b[k] {
				changed++
			}
		}
		require.Equal(t, 4+Size, changed, "client, monitoring and route listeners, store_dir and the %d routes", Size)
	}
}

// A shipped config that lost a line the rendering rewrites is refused with
// ErrConfigShape rather than run half-rewritten (a node listening on
// 0.0.0.0:4222, say).
func TestRenderConfigsRefusesAnUnexpectedShape(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "cluster"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "accounts.conf"), []byte("accounts {}\n"), 0o600))
	shipped, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "nats", "cluster", "nats-1.conf"))
	require.NoError(t, err)
	for i := range Size {
		conf := strings.ReplaceAll(string(shipped), "server_name: nats-1", "server_name: "+NodeName(i))
		if i == 1 {
			conf = strings.ReplaceAll(conf, "http: 0.0.0.0:8222", "http: 0.0.0.0:9999")
		}
		require.NoError(t, os.WriteFile(filepath.Join(src, "cluster", NodeName(i)+".conf"), []byte(conf), 0o600))
	}
	_, err = RenderConfigs(src, t.TempDir(), [Size]Ports{}, [Size]string{})
	require.ErrorIs(t, err, ErrConfigShape)
	require.ErrorContains(t, err, "nats-2.conf")
	require.ErrorContains(t, err, "http: 0.0.0.0:8222")
}

// The shipped lame duck settings are read as grace period plus duration,
// and a config without them is refused.
func TestLameDuckReadsTheShippedSettings(t *testing.T) {
	t.Parallel()
	shipped, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "nats", "cluster", "nats-1.conf"))
	require.NoError(t, err)
	d, err := LameDuck(string(shipped))
	require.NoError(t, err)
	require.Equal(t, 40*time.Second, d, "30s lame_duck_duration + 10s lame_duck_grace_period")
	_, err = LameDuck("lame_duck_duration: 30s\n")
	require.ErrorIs(t, err, ErrConfigShape)
	_, err = LameDuck("lame_duck_duration: soon\nlame_duck_grace_period: 1s\n")
	require.ErrorIs(t, err, ErrConfigShape)
}
