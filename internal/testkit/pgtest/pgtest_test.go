package pgtest

import (
	"testing"
	"time"
)

// The server starts (as an unprivileged user when the test runs as
// root), answers on its loopback port, keeps a committed row through an
// immediate stop (a crash, no shutdown checkpoint) and a start.
func TestServerKeepsCommittedRowsThroughACrash(t *testing.T) {
	s := Start(t, "synchronous_commit=on")
	s.Psql(t, "CREATE TABLE t (id text PRIMARY KEY)")
	s.Psql(t, "INSERT INTO t VALUES ('evt_1') ON CONFLICT DO NOTHING")
	if got := s.Psql(t, "SHOW listen_addresses"); got != "127.0.0.1" {
		t.Errorf("listen_addresses %q", got)
	}
	s.Stop(t)
	s.Ctl(t, "start")
	s.WaitReady(t, 10*time.Second)
	if got := s.Psql(t, "SELECT count(*) FROM t WHERE id = 'evt_1'"); got != "1" {
		t.Fatalf("after an immediate stop and a start: %q rows, want 1", got)
	}
}
