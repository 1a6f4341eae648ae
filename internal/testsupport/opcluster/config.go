package opcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Size is the number of nodes of the shipped cluster configuration.
const Size = 3

// ErrConfigShape is returned when a shipped configuration no longer has a
// line the rendering rewrites: the shipped file changed, and the rendering
// must change with it rather than run a config it did not check.
var ErrConfigShape = errors.New("opcluster: shipped NATS config has an unexpected shape")

// Ports are the addresses of one node on 127.0.0.1.
type Ports struct {
	Client, Monitor, Route int
}

// NodeName is the server_name of node i (0-based) in the shipped configs.
func NodeName(i int) string { return "nats-" + strconv.Itoa(i+1) }

// RenderConfigs copies the shipped configuration under srcDir
// (deploy/nats: cluster/nats-{1,2,3}.conf and accounts.conf) to dstDir with
// the same layout, so that each node's `include ../accounts.conf` reads the
// shipped accounts file unchanged. In each node file it rewrites only the
// addresses and the store directory: the client, monitoring and route
// listeners move from 0.0.0.0 and the fixed ports to 127.0.0.1 and
// ports[i], the routes name 127.0.0.1 and the other nodes' route ports
// instead of the docker-compose hostnames, and store_dir becomes
// storeDirs[i]. Every other line (JetStream limits, lame duck, accounts,
// permissions) is the shipped one. It returns the paths of the three node
// files. A line it expects to rewrite that is missing or repeated is
// ErrConfigShape.
func RenderConfigs(srcDir, dstDir string, ports [Size]Ports, storeDirs [Size]string) ([Size]string, error) {
	var out [Size]string
	if err := os.MkdirAll(filepath.Join(dstDir, "cluster"), 0o755); err != nil {
		return out, err
	}
	accounts, err := os.ReadFile(filepath.Join(srcDir, "accounts.conf"))
	if err != nil {
		return out, err
	}
	if err := os.WriteFile(filepath.Join(dstDir, "accounts.conf"), accounts, 0o600); err != nil {
		return out, err
	}
	for i := range Size {
		name := NodeName(i) + ".conf"
		src, err := os.ReadFile(filepath.Join(srcDir, "cluster", name))
		if err != nil {
			return out, err
		}
		conf, err := renderNode(string(src), i, ports, storeDirs[i])
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		out[i] = filepath.Join(dstDir, "cluster", name)
		if err := os.WriteFile(out[i], []byte(conf), 0o600); err != nil {
			return out, err
		}
	}
	return out, nil
}

// renderNode applies node i's rewrites to the text of its shipped config.
func renderNode(conf string, i int, ports [Size]Ports, storeDir string) (string, error) {
	local := func(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
	rewrites := [][2]string{
		{"server_name: " + NodeName(i) + "\n", "server_name: " + NodeName(i) + "\n"}, // must be node i's file
		{"listen: 0.0.0.0:4222", "listen: " + local(ports[i].Client)},
		{"http: 0.0.0.0:8222", "http: " + local(ports[i].Monitor)},
		{`store_dir: "/data/jetstream"`, "store_dir: " + strconv.Quote(storeDir)},
		{"listen: 0.0.0.0:6222", "listen: " + local(ports[i].Route)},
	}
	for j := range Size {
		rewrites = append(rewrites, [2]string{"nats-route://" + NodeName(j) + ":6222", "nats-route://" + local(ports[j].Route)})
	}
	for _, rw := range rewrites {
		if n := strings.Count(conf, rw[0]); n != 1 {
			return "", fmt.Errorf("%w: %q occurs %d times, want once", ErrConfigShape, strings.TrimSpace(rw[0]), n)
		}
		conf = strings.Replace(conf, rw[0], rw[1], 1)
	}
	return conf, nil
}

// lameDuckSetting matches a lame duck setting of a NATS config line.
var lameDuckSetting = regexp.MustCompile(`(?m)^lame_duck_(duration|grace_period):\s*(\S+)\s*$`)

// LameDuck reads how long a node of conf takes to stop in lame duck mode:
// lame_duck_grace_period (before clients are moved off) plus
// lame_duck_duration (over which they are). A config without both
// settings is ErrConfigShape.
func LameDuck(conf string) (time.Duration, error) {
	var total time.Duration
	seen := map[string]bool{}
	for _, m := range lameDuckSetting.FindAllStringSubmatch(conf, -1) {
		d, err := time.ParseDuration(m[2])
		if err != nil {
			return 0, fmt.Errorf("%w: lame_duck_%s: %v", ErrConfigShape, m[1], err)
		}
		seen[m[1]] = true
		total += d
	}
	if !seen["duration"] || !seen["grace_period"] {
		return 0, fmt.Errorf("%w: want lame_duck_duration and lame_duck_grace_period", ErrConfigShape)
	}
	return total, nil
}
