package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// Bouncer is a PgBouncer in front of a Server, on a free loopback port
// and on no Unix socket.
type Bouncer struct {
	Addr string // 127.0.0.1:port
	Port int
	Dir  string // holds pgbouncer.ini and pgbouncer.log
}

// StartBouncer starts PgBouncer in front of srv, in transaction pooling
// mode (pool_mode = transaction), trusting the users named (each must
// be a role of srv that srv trusts on loopback, as it does every role
// unless Options.HBA says otherwise): every database of srv is reached
// under its own name. settings are more [pgbouncer] settings, name =
// value, after the defaults (a later one wins). The test's cleanup
// stops it. It fails the test with a clear message when PgBouncer is
// missing; go test -short leaves out every test that needs one. As
// root, it runs as the user the server runs as (PgBouncer refuses
// root).
func StartBouncer(t testing.TB, srv *Server, users []string, settings ...string) *Bouncer {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a real PgBouncer")
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"} {
			if isExecutable(p) {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("pgbouncer is not installed (Debian: apt-get install pgbouncer): the PgBouncer tests need a real one (.ci/run installs it)")
	}
	dir, err := os.MkdirTemp("", "pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &Bouncer{Dir: dir, Port: netkit.FreePort(t)}
	b.Addr = "127.0.0.1:" + strconv.Itoa(b.Port)
	var auth strings.Builder
	for _, u := range users {
		fmt.Fprintf(&auth, "%q \"\"\n", u)
	}
	ini := []string{
		"[databases]",
		fmt.Sprintf("* = host=127.0.0.1 port=%d", srv.Port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(b.Port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "users.txt"),
		"pool_mode = transaction",
		"default_pool_size = 8",
		"max_client_conn = 200",
		"logfile = " + b.Log(),
	}
	ini = append(ini, settings...)
	files := map[string]string{
		"users.txt":     auth.String(),
		"pgbouncer.ini": strings.Join(ini, "\n") + "\n",
		"pgbouncer.log": "",
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = srv.cred
		if cred == nil {
			cred = unprivileged(t)
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // PgBouncer's immediate shutdown
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			c.Close()
			return b
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("pgbouncer exited: %v\n%s", err, b.readLog())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not listening on %s within 10s\n%s", b.Addr, b.readLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Log is PgBouncer's log file.
func (b *Bouncer) Log() string { return filepath.Join(b.Dir, "pgbouncer.log") }

func (b *Bouncer) readLog() string {
	l, _ := os.ReadFile(b.Log())
	return string(l)
}
