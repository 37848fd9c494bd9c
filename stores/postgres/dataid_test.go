package postgres

import (
	"strings"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// serverNamed reports whether id is the server's name for a table, not
// the DSN's fallback.
func serverNamed(id string) bool { return strings.HasPrefix(id, "postgres system_identifier ") }

// TestDataIDBehindPgBouncer: behind PgBouncer with its defaults (which
// refuse statement_timeout as a startup parameter) the store's state ID
// is the server's name for the table, the one a direct connection gets,
// and provision logs no "postgres identity unknown". (Found by review:
// the identity question ran on a fresh connection that still sent
// statement_timeout, PgBouncer refused it, and unlike the table check
// the question was not asked again without it: a false warning at every
// start behind a pooler, and the DSN's spelling compared instead.)
func TestDataIDBehindPgBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	b := pgtest.StartBouncer(t, srv, []string{"postgres"})
	table := uniqueTable()
	direct, _ := provision(t, storeJSON(srv.DSN, table))
	if !serverNamed(direct.DataID()) {
		t.Fatalf("direct connection: state ID %q is not the server's", direct.DataID())
	}
	for _, mode := range []string{"exec", "simple_protocol"} {
		s, logs := provision(t, storeJSON(bouncerDSN(b, mode), table))
		if s.DataID() != direct.DataID() {
			t.Errorf("%s: behind PgBouncer state ID %q, directly %q", mode, s.DataID(), direct.DataID())
		}
		if n := logs.FilterMessage("postgres identity unknown").Len(); n != 0 {
			t.Errorf("%s: %d \"postgres identity unknown\" warnings at provision: %v", mode, n, logs.All())
		}
	}
}

// TestDataIDKeptForThePool: a store provisioned while the server is
// down gets the DSN's ID; another config on the same pool (a reload, or
// a second route with the same settings) provisioned once the server is
// up gets the same ID, not the server's: one pool, one ID, so commit
// retries registered under it are stopped by a forget through either
// config, and two routes of one load do not differ. (Found by review:
// the fallback was not kept and the next provision asked again, so a
// reload changed the ID of a pool whose retries were registered under
// the old one; the forget through the new config missed them.) A new
// pool (a changed DSN) asks the server.
func TestDataIDKeptForThePool(t *testing.T) {
	srv := pgtest.Start(t)
	srv.Stop(t)
	table := uniqueTable()
	raw := storeJSON(srv.DSN, table)
	a, alogs := provision(t, raw)
	if serverNamed(a.DataID()) {
		t.Fatalf("server down: state ID %q", a.DataID())
	}
	if n := alogs.FilterMessage("postgres identity unknown").Len(); n != 1 {
		t.Fatalf("server down: %d \"postgres identity unknown\" warnings at provision, want 1: %v", n, alogs.All())
	}

	srv.Ctl(t, "start")
	b, _ := provision(t, raw)
	if b.db != a.db {
		t.Fatal("the second provision does not share the first one's pool; the test shows nothing")
	}
	if b.DataID() != a.DataID() {
		t.Errorf("one pool, two state IDs: %q while the server was down, %q once it was up", a.DataID(), b.DataID())
	}

	c, _ := provision(t, storeJSON(srv.DSN+"&application_name=changed", table))
	if c.db == a.db || !serverNamed(c.DataID()) {
		t.Errorf("a new pool with the server up: state ID %q, want the server's", c.DataID())
	}
}
