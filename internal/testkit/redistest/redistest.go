// Package redistest starts real redis-server processes for tests, on free
// loopback ports: a standalone server, a Redis Cluster (3 masters, 3
// replicas) or a Sentinel setup (1 master, 1 replica, 3 sentinels). It
// fails the test with a clear message when redis-server is missing: the
// Redis tests never skip.
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// Bin returns the path of a redis-server (or redis-cli) binary, or fails
// the test. go test -short leaves out every test that needs one.
func Bin(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a real " + name)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed or not in PATH: the Redis tests need real Redis 7+ processes (Debian: apt-get install redis-server; .ci/run installs it)", name)
	}
	return p
}

// Server is one redis-server (or sentinel) process.
type Server struct {
	Addr string
	Port int
	Dir  string
	// TLS is the client configuration for a server that speaks TLS only
	// (StartTLS); nil for a plain one.
	TLS  *tls.Config
	args []string
	bin  string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// Start starts a redis-server that the test's cleanup stops; extra are
// more arguments (e.g. "--appendonly", "yes").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := newServer(t, Bin(t, "redis-server"), t.TempDir(), extra...)
	s.Restart(t)
	t.Cleanup(s.Kill)
	return s
}

func newServer(t testing.TB, bin, dir string, extra ...string) *Server {
	return newServerOn(t, netkit.FreePort(t), bin, dir, extra...)
}

// clusterPort is a free port whose cluster bus port (10000 above it) is
// free too: a node whose bus port is taken aborts at start.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := netkit.FreePort(t)
		if port+10000 > 65535 || !netkit.Reserve(port+10000) {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("found no free port whose cluster bus port is free too, in 100 tries")
	return 0
}

func newServerOn(t testing.TB, port int, bin, dir string, extra ...string) *Server {
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, bin: bin}
	s.args = append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--repl-diskless-sync-delay", "0",
		"--logfile", filepath.Join(dir, "redis.log"),
	}, extra...)
	return s
}

// Restart starts the server (again, after Kill) on the same port and
// directory, and waits until it answers PING.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmd = exec.Command(s.bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", s.bin, err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: s.TLS})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			t.Fatalf("%s on %s did not answer within 15s: %v\n%s", filepath.Base(s.bin), s.Addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the process (SIGKILL) and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Client returns a client to this server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.TLS})
	t.Cleanup(func() { c.Close() })
	return c
}

// Cluster is a Redis Cluster of 3 masters and 3 replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the addresses of every node.
func (c *Cluster) Addrs() []string { return addrs(c.Nodes) }

func addrs(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}

// waitUntil polls cond every 50 ms and fails the test with what (and
// cond's last detail) if it does not hold within timeout.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v\n%s", what, timeout, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartCluster starts 6 nodes and joins them with redis-cli --cluster
// create (3 masters, one replica each).
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	bin := Bin(t, "redis-server")
	cli := Bin(t, "redis-cli")
	c := &Cluster{}
	for range 6 {
		dir := t.TempDir()
		s := newServerOn(t, clusterPort(t), bin, dir, append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "1000",
			// A replica may take over whatever its data age (tests kill
			// masters seconds after start), and syncs without delay.
			"--cluster-replica-validity-factor", "0"}, extra...)...)
		s.Restart(t)
		t.Cleanup(s.Kill)
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node reports the cluster ok and every replica's
	// link to its master is up (a replica that never synced cannot
	// take over).
	for _, n := range c.Nodes {
		rc := n.Client(t)
		waitUntil(t, 30*time.Second, "cluster ok on "+n.Addr, func() (bool, string) {
			info, _ := rc.ClusterInfo(context.Background()).Result()
			repl, _ := rc.Info(context.Background(), "replication").Result()
			return strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")), info + repl
		})
	}
	return c
}

// Sentinel is a master, a replica and 3 sentinels watching "mymaster".
type Sentinel struct {
	Master, Replica *Server
	Sentinels       []*Server
}

// MasterName is the name the sentinels monitor.
const MasterName = "mymaster"

// SentinelAddrs returns the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string { return addrs(s.Sentinels) }

// StartSentinel starts the master, the replica and three sentinels.
func StartSentinel(t testing.TB, extra ...string) *Sentinel {
	t.Helper()
	bin := Bin(t, "redis-server")
	st := &Sentinel{}
	st.Master = newServer(t, bin, t.TempDir(), extra...)
	st.Master.Restart(t)
	t.Cleanup(st.Master.Kill)
	st.Replica = newServer(t, bin, t.TempDir(), append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(st.Master.Port)}, extra...)...)
	st.Replica.Restart(t)
	t.Cleanup(st.Replica.Kill)
	for range 3 {
		dir := t.TempDir()
		port := netkit.FreePort(t)
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
			port, dir, filepath.Join(dir, "redis.log"), MasterName, st.Master.Port, MasterName, MasterName, MasterName)
		path := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, bin: bin, args: []string{path, "--sentinel"}}
		s.Restart(t)
		t.Cleanup(s.Kill)
		st.Sentinels = append(st.Sentinels, s)
	}
	// Wait until the sentinels know the replica and each other.
	sc := redis.NewSentinelClient(&redis.Options{Addr: st.Sentinels[0].Addr})
	defer sc.Close()
	waitUntil(t, 30*time.Second, "sentinels ready", func() (bool, string) {
		reps, _ := sc.Replicas(context.Background(), MasterName).Result()
		sens, _ := sc.Sentinels(context.Background(), MasterName).Result()
		return len(reps) == 1 && len(sens) == 2, fmt.Sprintf("%d replicas, %d other sentinels seen", len(reps), len(sens))
	})
	return st
}

// StartReplica starts a replica of master and waits until its link is up.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	s := newServer(t, Bin(t, "redis-server"), t.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	s.Restart(t)
	t.Cleanup(s.Kill)
	c := s.Client(t)
	waitUntil(t, 20*time.Second, "replica of "+master.Addr+" in sync", func() (bool, string) {
		info, _ := c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up"), info
	})
	return s
}

// UsedMemory is the server's used_memory (INFO memory), in bytes: what
// a benchmark of bytes per record compares before and after.
func UsedMemory(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}
