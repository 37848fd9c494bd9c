package postgres

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// TestLocalCacheOneTableTwoSpellings: two instances on one table, one
// naming it "t", the other "public.t" (one state ID): a forget through
// A reaches B's cache. (Found by review: the forget channel was named
// after the spelling, so B kept answering the forgotten event as a
// duplicate for as long as its record would have lived.)
func TestLocalCacheOneTableTwoSpellings(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	a, _ := provision(t, storeJSON(srv.DSN, table, "local_cache", "100"))
	b, _ := provision(t, storeJSON(srv.DSN, "public."+table, "local_cache", "100"))
	if a.DataID() != b.DataID() {
		t.Fatalf("state IDs differ: %q %q", a.DataID(), b.DataID())
	}
	waitFor(t, "both caches live", func() bool { return a.db.cache.Live() && b.db.cache.Live() })
	processed(t, a, "evt_1")
	if res := claimResult(t, b, "evt_1"); res != dedup.AlreadyDone {
		t.Fatalf("B: %v", res)
	}
	claimResult(t, b, "evt_1") // from B's cache
	if _, deleted, err := a.Forget(context.Background(), "evt_1", false); err != nil || !deleted {
		t.Fatalf("forget on A: %v %v", deleted, err)
	}
	waitFor(t, "B processes the forgotten event", func() bool {
		res, _, err := b.Claim(context.Background(), "evt_1", "tokB", 60e9)
		return err == nil && res == dedup.Claimed
	})
}

// TestDataIDWithoutTheServer: when the server cannot be asked which
// table a DSN reaches (down at Caddy's start), the state ID is the
// DSN's with what libpq fills in filled in, spelled one way: a database
// left out is the user's, a Unix socket is localhost on its port, and
// the host's spelling and the other settings make no difference; another
// database or port is another table. (Found by review: a DSN without
// the database name and one with it, or the socket and localhost, were
// two stores to the handler's check.)
func TestDataIDWithoutTheServer(t *testing.T) {
	port := strconv.Itoa(netkit.FreePort(t)) // nothing listens there
	id := func(dsn string) string {
		t.Helper()
		o, err := (&Store{DSN: dsn}).resolve()
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		return o.stateID()
	}
	for _, same := range [][2]string{
		{"postgres://u@127.0.0.1:" + port, "postgres://u@localhost:" + port + "/u?sslmode=disable"},
		{"host=/run/postgresql port=" + port + " user=u dbname=d", "postgres://u@[::1]:" + port + "/d"},
		{"postgres://u@/d?host=/tmp&port=" + port, "host=LOCALHOST. port=" + port + " user=u dbname=d connect_timeout=3"},
		{"postgres://u:pw@db.example:5432/app?application_name=x", "host=DB.example. user=u dbname=app sslmode=require"},
		{"postgres://u@a.example,b.example/d", "postgres://u@b.example:5432,a.example/d"},
	} {
		if a, b := id(same[0]), id(same[1]); a != b {
			t.Errorf("one table, two state IDs:\n%s -> %s\n%s -> %s", same[0], a, same[1], b)
		}
	}
	for _, differ := range [][2]string{
		{"postgres://u@127.0.0.1:" + port + "/a", "postgres://u@127.0.0.1:" + port + "/b"},
		{"postgres://u@127.0.0.1:" + port + "/a", "postgres://u@127.0.0.1:5432/a"},
		{"postgres://u@db.example/a", "postgres://u@db2.example/a"},
	} {
		if a, b := id(differ[0]), id(differ[1]); a == b {
			t.Errorf("two tables, one state ID %s:\n%s\n%s", a, differ[0], differ[1])
		}
	}

	// Provisioned with the server down: the same, without waiting long.
	start := time.Now()
	a, _ := provision(t, storeJSON("postgres://postgres@127.0.0.1:"+port+"?sslmode=disable", ""))
	b, _ := provision(t, storeJSON("postgres://postgres@/postgres?host=/nonexistent&port="+port, ""))
	if a.DataID() != b.DataID() {
		t.Errorf("server down: state IDs differ: %q %q", a.DataID(), b.DataID())
	}
	if d := time.Since(start); d > 2*identifyTimeout {
		t.Errorf("provisioning with the server down took %v", d)
	}

	// The warning names what is compared, never the password.
	const pw = "s3cret-identity-pw"
	c, logs := provision(t, storeJSON("postgres://postgres:"+pw+"@127.0.0.1:"+port+"/postgres?sslmode=disable", ""))
	if id := c.DataID(); id != a.DataID() {
		t.Errorf("state ID %q, want %q", id, a.DataID())
	}
	warned := logs.FilterMessage("postgres identity unknown").All()
	if len(warned) != 1 || warned[0].ContextMap()["compared_as"] != a.DataID() {
		t.Fatalf("warnings: %v", logs.All())
	}
	if b, _ := json.Marshal(warned[0].ContextMap()); strings.Contains(string(b), pw) {
		t.Errorf("the password is in the warning: %s", b)
	}
}
