// Package pgtest starts real PostgreSQL servers for tests (initdb and
// pg_ctl of the installed PostgreSQL, Debian's postgresql-15 here), each
// in a temporary directory, listening on a free loopback port and on no
// Unix socket. It fails the test with a clear message when PostgreSQL is
// missing: the PostgreSQL tests never skip.
//
// initdb and postgres refuse to run as root, and CI runs as root: there
// the server runs as an unprivileged user (the "postgres" user that
// Debian's package creates, else "nobody"), its directory owned by it.
package pgtest

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// Bin returns the path of one of PostgreSQL's programs (initdb, pg_ctl,
// psql, ...), as Find, or fails the test. go test -short leaves out
// every test that needs one.
func Bin(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a real PostgreSQL")
	}
	p, err := Find(name)
	if err != nil {
		t.Fatalf("%v: the PostgreSQL tests need a real server (.ci/run installs it)", err)
	}
	return p
}

// Find returns the path of one of PostgreSQL's programs: from $PG_BIN if
// set, else the newest /usr/lib/postgresql/<version>/bin (Debian keeps
// them there, off the PATH), else the PATH; or an error saying what to
// install. cmd/sangho-bench starts its server with it too.
func Find(name string) (string, error) {
	var dirs []string
	if d := os.Getenv("PG_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versions, func(a, b string) int { return versionOf(b) - versionOf(a) })
	dirs = append(dirs, versions...)
	for _, d := range dirs {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("PostgreSQL's %s is not installed (Debian: apt-get install postgresql), or set PG_BIN to the folder of its programs", name)
}

func versionOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Server is one PostgreSQL server.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int
	Dir  string // holds data/ and postgres.log
	// DSN connects as the superuser "postgres" (trust authentication on
	// loopback) to the database "postgres".
	DSN string

	cred  *syscall.Credential // the unprivileged user, when the test runs as root
	pgctl string
}

// Start runs initdb and starts a server that the test's cleanup stops.
// settings are more server settings, name=value (e.g. "ssl=on").
func Start(t testing.TB, settings ...string) *Server {
	t.Helper()
	return StartWith(t, Options{Settings: settings})
}

// Options are what StartWith sets up besides Start's defaults.
type Options struct {
	// Settings are more server settings, name=value (e.g. "ssl=on").
	Settings []string
	// HBA, if set, replaces pg_hba.conf (initdb's trusts every local
	// connection), one rule a line.
	HBA []string
	// Files are written into the data directory, readable by the server
	// only (as a private key must be), before it starts: a setting
	// names one relative to the data directory (ssl_cert_file =
	// 'server.crt').
	Files map[string][]byte
}

// StartWith is Start with more options.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	settings := opts.Settings
	initdb := Bin(t, "initdb")
	s := &Server{pgctl: Bin(t, "pg_ctl")}
	dir, err := os.MkdirTemp("", "pgtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s.Dir = dir
	if os.Geteuid() == 0 {
		s.cred = unprivileged(t)
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	s.run(t, initdb, "-D", s.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	s.Port = netkit.FreePort(t)
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
	s.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", s.Addr)
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(s.Port),
		"unix_socket_directories = ''",
		"fsync = on", // the tests are about durability: keep PostgreSQL's own
		"max_connections = 200",
	}
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		conf = append(conf, strings.TrimSpace(k)+" = "+strings.TrimSpace(v))
	}
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("\n# pgtest\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range opts.Files {
		s.writeFile(t, name, b)
	}
	if opts.HBA != nil {
		s.writeFile(t, "pg_hba.conf", []byte(strings.Join(opts.HBA, "\n")+"\n"))
	}
	s.Ctl(t, "start")
	t.Cleanup(func() { s.stop("immediate") })
	return s
}

// Ctl runs pg_ctl with verb ("start", "stop", "restart") and more
// arguments (e.g. "-m", "immediate"), waiting until it is done.
func (s *Server) Ctl(t testing.TB, verb string, args ...string) {
	t.Helper()
	args = append([]string{verb, "-D", s.data(), "-l", s.Log(), "-w", "-t", "30"}, args...)
	s.run(t, s.pgctl, args...)
}

// Stop stops the server at once (pg_ctl stop -m immediate: no shutdown
// checkpoint, as a crash); Ctl(t, "start") starts it again.
func (s *Server) Stop(t testing.TB) { s.Ctl(t, "stop", "-m", "immediate") }

func (s *Server) stop(mode string) {
	cmd := exec.Command(s.pgctl, "stop", "-D", s.data(), "-m", mode, "-w", "-t", "30")
	cmd.SysProcAttr = s.attr()
	_ = cmd.Run() // already stopped is fine
}

// Log is the server's log file.
func (s *Server) Log() string { return filepath.Join(s.Dir, "postgres.log") }

// Psql runs one SQL command through psql as the superuser and returns
// its output (unaligned, tuples only).
func (s *Server) Psql(t testing.TB, sql string) string {
	t.Helper()
	cmd := exec.Command(Bin(t, "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", s.DSN, "-c", sql)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql %q: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

// writeFile writes a file of the data directory, 0600, owned by the
// server's user.
func (s *Server) writeFile(t testing.TB, name string, b []byte) {
	t.Helper()
	p := filepath.Join(s.data(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if s.cred != nil {
		if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// DSNAs connects as user with password (none if empty) to the database
// "postgres", without TLS.
func (s *Server) DSNAs(user, password string) string {
	u := url.UserPassword(user, password)
	if password == "" {
		u = url.User(user)
	}
	return (&url.URL{Scheme: "postgres", User: u, Host: s.Addr, Path: "/postgres", RawQuery: "sslmode=disable"}).String()
}

func (s *Server) attr() *syscall.SysProcAttr {
	if s.cred == nil {
		return nil
	}
	return &syscall.SysProcAttr{Credential: s.cred}
}

func (s *Server) run(t testing.TB, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = s.attr()
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(s.Log())
		t.Fatalf("%s %s: %v\n%s\n%s", filepath.Base(bin), strings.Join(args, " "), err, out, log)
	}
}

// unprivileged is the user a root test runs PostgreSQL as.
func unprivileged(t testing.TB) *syscall.Credential {
	t.Helper()
	cred, err := Unprivileged()
	if err != nil {
		t.Fatal(err)
	}
	return cred
}

// Unprivileged is the user to run PostgreSQL as when this process is
// root (initdb refuses root): "postgres", which Debian's package creates,
// else "nobody".
func Unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, and no unprivileged user (postgres, nobody) to run PostgreSQL as: initdb refuses root")
}

// WaitReady waits (at most timeout) until the server accepts
// connections, e.g. after a restart by another means.
func (s *Server) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		cmd := exec.Command(Bin(t, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-t", "1")
		if cmd.Run() == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.Log())
			t.Fatalf("PostgreSQL on %s not ready within %v\n%s", s.Addr, timeout, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
