package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// previousDDL is the table as the release before HOT commits made it.
const previousDDL = `CREATE TABLE %[1]s (
  event_id         text        PRIMARY KEY,
  event_type       text        NOT NULL DEFAULT '',
  processed_at     timestamptz,
  fingerprint      text        NOT NULL DEFAULT '',
  message_event_id text,
  lease_token      text,
  expires_at       timestamptz NOT NULL,
  CHECK ((lease_token IS NULL) = (processed_at IS NOT NULL))
);
CREATE INDEX %[1]s_expires_at ON %[1]s (expires_at);
INSERT INTO %[1]s (event_id, processed_at, event_type, fingerprint, expires_at)
  VALUES ('done', now(), 'invoice.paid', '0123456789abcdef0123456789abcdef', now() + interval '1 hour');
INSERT INTO %[1]s (event_id, lease_token, expires_at) VALUES ('mark', 'oldtok', now() - interval '1 minute')`

// A table made by the previous release, found by four Caddy instances
// starting at once (four pools), loses its index on expires_at and gets
// the fillfactor; its rows keep their meaning (a done record, a mark),
// and commits from then on are HOT updates.
func TestUpgradePreviousTable(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	srv.Psql(t, fmt.Sprintf(previousDDL, table))
	var stores []*Store
	for i := range 4 {
		s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", fmt.Sprint(4+i)))
		stores = append(stores, s)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			if res, _, err := s.Claim(ctx, fmt.Sprint("new_", i), "tok", time.Minute); err != nil || res != dedup.Claimed {
				t.Errorf("instance %d: claim = %v, %v", i, res, err)
			}
		})
	}
	wg.Wait()
	s := stores[0]
	if got := srv.Psql(t, `SELECT count(*) FROM pg_indexes WHERE tablename = '`+table+`'`); got != "1" {
		t.Fatalf("%s indexes after the upgrade, want the primary key alone", got)
	}
	if got := srv.Psql(t, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = '`+table+`'::regclass`); got != "fillfactor="+fillfactor {
		t.Fatalf("reloptions %q", got)
	}
	if res, v, err := s.Claim(ctx, "done", "tok", time.Minute); err != nil || res != dedup.AlreadyDone || !strings.Contains(v, "invoice.paid") {
		t.Fatalf("claim of the old done record = %v %q %v", res, v, err)
	}
	if res, v, err := s.Claim(ctx, "mark", "tok", time.Minute); err != nil || res != dedup.Reclaimed || v != dedup.LeaseValue("oldtok") {
		t.Fatalf("claim over the old mark = %v %q %v", res, v, err)
	}
	assertHOT(t, srv, s, table)
}

// assertHOT commits 200 claims and wants most commits HOT.
func assertHOT(t *testing.T, srv *pgtest.Server, s *Store, table string) {
	t.Helper()
	ctx := context.Background()
	srv.Psql(t, `SELECT pg_stat_reset()`)
	for i := range 200 {
		key := fmt.Sprint("hot_", i)
		if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
			t.Fatal(err)
		}
		if held, err := s.Commit(ctx, key, "tok", dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "x", Fingerprint: "0123456789abcdef0123456789abcdef"}, time.Hour); err != nil || !held {
			t.Fatal(held, err)
		}
	}
	var got string
	// A backend reports its statistics at a transaction's end at most
	// once a second, and an idle one within 10 s (PostgreSQL 15's
	// PGSTAT_IDLE_INTERVAL): the pool's connections go idle after the
	// last commit, so wait up to 25 s. (Seen short of 200 at 5 s.)
	for deadline := time.Now().Add(25 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got = srv.Psql(t, `SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '`+table+`'`)
		var u int
		if fmt.Sscan(got, &u); u >= 200 || time.Now().After(deadline) {
			break
		}
	}
	var upd, hot int
	fmt.Sscan(got, &upd, &hot)
	if upd < 200 || hot*10 < upd*9 {
		t.Fatalf("updates, HOT updates = %q: want at least 9 in 10 commits HOT", got)
	}
}

// A new table's commits are HOT updates.
func TestCommitIsHOT(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table))
	assertHOT(t, srv, s, table)
}

// A role that does not own a previous release's table cannot upgrade
// it: it says so once and works as before.
func TestUpgradeNotOwner(t *testing.T) {
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	table := uniqueTable()
	srv.Psql(t, fmt.Sprintf(previousDDL, table))
	srv.Psql(t, `CREATE ROLE notowner LOGIN PASSWORD 'pw'; GRANT SELECT, INSERT, UPDATE, DELETE ON `+table+` TO notowner`)
	s, logs := provision(t, storeJSON(srv.DSNAs("notowner", "pw"), table, "create_table", "false"))
	everyOperation(t, s)
	if n := logs.FilterMessageSnippet("kept as an earlier release made it").Len(); n != 1 {
		t.Fatalf("%d warnings, want 1", n)
	}
	if got := srv.Psql(t, `SELECT count(*) FROM pg_indexes WHERE tablename = '`+table+`'`); got != "2" {
		t.Fatalf("%s indexes", got)
	}
}

// The docs' upgrade, run by hand as the owner, gives the table the
// store's own layout.
func TestDocsUpgrade(t *testing.T) {
	srv := pgtest.Start(t)
	srv.Psql(t, fmt.Sprintf(previousDDL, "processed_webhook_events"))
	psqlFile(t, srv.DSN, docBlock(t, "upgrade"))
	if got := srv.Psql(t, `SELECT count(*) || ' ' || (SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'processed_webhook_events') FROM pg_indexes WHERE tablename = 'processed_webhook_events'`); got != "1 fillfactor="+fillfactor {
		t.Fatalf("after the docs' upgrade: %q", got)
	}
}
