package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

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

// TestDataIDOfAPoolOpenedWhileTheServerWasDown: a store provisioned
// while the server is down gets the DSN's ID, and so does another store
// of the same load on the pool (two routes of one load do not differ,
// and the second does not wait again). A later load (a reload) on the
// same pool, once the server is up, asks again and gets the server's
// ID, so that it is compared like any pool opened since (a pool kept
// the DSN's ID for its life before, and a reload could put two
// endpoints on one table and key_prefix unnoticed:
// TestServerIdentityAskedAgainOnceTheServerAnswers); the DSN's ID is
// then its alias, so that a forget through the later config stops the
// commit retries registered under it (TestForgetStopsCommitRetriesUnderAnAlias).
// The server's ID is kept for the pool's life.
func TestDataIDOfAPoolOpenedWhileTheServerWasDown(t *testing.T) {
	srv := pgtest.Start(t)
	srv.Stop(t)
	table := uniqueTable()
	raw := storeJSON(srv.DSN, table)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a, alogs := provisionIn(t, ctx, raw)
	if serverNamed(a.DataID()) {
		t.Fatalf("server down: state ID %q", a.DataID())
	}
	if n := alogs.FilterMessage("postgres identity unknown").Len(); n != 1 {
		t.Fatalf("server down: %d \"postgres identity unknown\" warnings at provision, want 1: %v", n, alogs.All())
	}
	srv.Ctl(t, "start")
	a2, a2logs := provisionIn(t, ctx, raw)
	if a2.db != a.db || a2.DataID() != a.DataID() || a2logs.FilterMessage("postgres identity unknown").Len() != 0 {
		t.Fatalf("a second store of the same load: state ID %q (first %q), same pool %v, logs %v", a2.DataID(), a.DataID(), a2.db == a.db, a2logs.All())
	}

	b, _ := provision(t, raw) // another load
	if b.db != a.db {
		t.Fatal("the later load's store does not share the first one's pool; the test shows nothing")
	}
	if !serverNamed(b.DataID()) {
		t.Errorf("a later load on the pool, the server up: state ID %q, want the server's", b.DataID())
	}
	if al := b.DataAliases(); len(al) != 1 || al[0] != a.DataID() {
		t.Errorf("aliases %q, want the DSN's ID %q", al, a.DataID())
	}
	if c, _ := provision(t, raw); c.DataID() != b.DataID() {
		t.Errorf("the server's ID is not kept for the pool: %q, then %q", b.DataID(), c.DataID())
	}

	c, _ := provision(t, storeJSON(srv.DSN+"&application_name=changed", table))
	if len(c.DataAliases()) != 0 {
		t.Errorf("a new pool opened with the server up has aliases %q", c.DataAliases())
	}
	if c.db == a.db || !serverNamed(c.DataID()) {
		t.Errorf("a new pool with the server up: state ID %q, want the server's", c.DataID())
	}
}
