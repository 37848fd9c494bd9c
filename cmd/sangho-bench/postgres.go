package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// pgServer is the benchmark's PostgreSQL: initdb and pg_ctl of the
// installed server (Debian keeps them in /usr/lib/postgresql/<v>/bin),
// in a temporary directory, on a loopback port, with fsync and
// synchronous_commit on (a done record as durable as PostgreSQL makes
// it). As root (initdb refuses root) it runs as the user "postgres" or
// "nobody", as internal/testkit/pgtest does for the tests.
type pgServer struct {
	dir, pgctl string
	port       int
	cred       *syscall.Credential
}

func startPostgres(tmp string) (*pgServer, error) {
	initdb, err := pgtest.Find("initdb")
	if err != nil {
		return nil, fmt.Errorf("%w; --only without postgres skips it", err)
	}
	pgctl, err := pgtest.Find("pg_ctl")
	if err != nil {
		return nil, fmt.Errorf("%w; --only without postgres skips it", err)
	}
	s := &pgServer{dir: filepath.Join(tmp, "pg"), pgctl: pgctl, port: freePort()}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if s.cred, err = pgtest.Unprivileged(); err != nil {
			return nil, err
		}
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, err
		}
		_ = os.Chmod(tmp, 0o755) // the server's user must reach its directory
	}
	data := filepath.Join(s.dir, "data")
	if err := s.run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	conf := strings.Join([]string{"",
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(s.port),
		"unix_socket_directories = ''",
		"fsync = on",
		"synchronous_commit = on",
		"max_connections = 100",
	}, "\n") + "\n"
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := s.run(pgctl, "start", "-D", data, "-l", filepath.Join(s.dir, "postgres.log"), "-w", "-t", "30"); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *pgServer) run(bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
		return fmt.Errorf("%s %s: %v\n%s\n%s", filepath.Base(bin), strings.Join(args, " "), err, out, log)
	}
	return nil
}

func (s *pgServer) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

func (s *pgServer) stop() {
	_ = s.run(s.pgctl, "stop", "-D", filepath.Join(s.dir, "data"), "-m", "fast", "-w", "-t", "30")
}

// cpuTicks is the CPU time of the postmaster and of every backend it
// forked (one process per connection), in clock ticks.
func (s *pgServer) cpuTicks() float64 {
	b, err := os.ReadFile(filepath.Join(s.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pm, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	total := cpuTicks(pm)
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		st, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		if ppid, _ := strconv.Atoi(f[1]); ppid == pm {
			u, _ := strconv.ParseFloat(f[11], 64)
			sy, _ := strconv.ParseFloat(f[12], 64)
			total += u + sy
		}
	}
	return total
}
