package sanghodedup

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testRedis is a real redis-server process on a free loopback port,
// started by the tests. It can be stopped and started again on the same
// port to test outages.
type testRedis struct {
	Addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	mu   sync.Mutex
}

// redisServerPath finds redis-server or fails the test with a clear
// message: the Redis tests never skip silently.
func redisServerPath(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed or not in PATH: the Redis store tests need a real Redis 7+ server (Debian: apt-get install redis-server; .ci/run installs it)")
	}
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRedis starts a redis-server that the test's cleanup stops. extra
// are more redis-server arguments (e.g. "--appendonly", "yes").
func startRedis(t testing.TB, extra ...string) *testRedis {
	t.Helper()
	bin := redisServerPath(t)
	port := freePort(t)
	r := &testRedis{Addr: "127.0.0.1:" + strconv.Itoa(port), port: port, dir: t.TempDir()}
	r.args = append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"),
	}, extra...)
	r.start(t, bin)
	t.Cleanup(r.Stop)
	return r
}

func (r *testRedis) start(t testing.TB, bin string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmd = exec.Command(bin, r.args...)
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			t.Fatalf("redis-server on %s did not answer within 10s: %v\n%s", r.Addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start starts the server again after Stop, on the same port.
func (r *testRedis) Start(t testing.TB) { r.start(t, redisServerPath(t)) }

// Stop kills the server and waits for it to exit.
func (r *testRedis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Client returns a plain client for inspecting the server.
func (r *testRedis) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func (r *testRedis) String() string { return fmt.Sprintf("redis-server at %s", r.Addr) }
