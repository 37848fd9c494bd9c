package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup/dedupstoretest"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

var tableSeq atomic.Int64

// uniqueTable names a fresh table for one test.
func uniqueTable() string { return fmt.Sprintf("events_%d", tableSeq.Add(1)) }

// provision provisions a store from its JSON, with logs observed from
// the start of Provision on.
func provision(t testing.TB, raw string) (*Store, *observer.ObservedLogs) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return provisionIn(t, ctx, raw)
}

// provisionIn is provision in the config load ctx (stores of one load
// share its context).
func provisionIn(t testing.TB, ctx caddy.Context, raw string) (*Store, *observer.ObservedLogs) {
	t.Helper()
	s := new(Store)
	if err := json.Unmarshal([]byte(raw), s); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	s.logger = zap.New(core)
	if err := s.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() { s.Cleanup() })
	return s, logs
}

func storeJSON(dsn, table string, extra ...string) string {
	m := map[string]any{"dsn": dsn, "table": table}
	for i := 0; i+1 < len(extra); i += 2 {
		var v any
		if err := json.Unmarshal([]byte(extra[i+1]), &v); err != nil {
			v = extra[i+1]
		}
		m[extra[i]] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestStoreContract(t *testing.T) {
	srv := pgtest.Start(t)
	admin := connect(t, srv.DSN)
	var mu sync.Mutex // one pgx.Conn is not for concurrent use
	dedupstoretest.Run(t, func(t *testing.T) dedupstoretest.Harness {
		table := uniqueTable()
		s, _ := provision(t, storeJSON(srv.DSN, table))
		read := func(key string) (row, time.Duration, bool) {
			mu.Lock()
			defer mu.Unlock()
			var r row
			var left time.Duration
			err := admin.QueryRow(context.Background(),
				`SELECT `+cols+`, extract(epoch from expires_at - now()) * 1e6 FROM `+table+` WHERE event_id = $1 AND `+present, key).
				Scan(append(r.dest(), &left)...)
			if errors.Is(err, pgx.ErrNoRows) {
				return row{}, 0, false
			}
			if err != nil {
				t.Fatal(err)
			}
			return r, left * time.Microsecond, true
		}
		return dedupstoretest.Harness{
			Store:  s,
			Elapse: time.Sleep,
			Value: func(key string) string {
				r, _, ok := read(key)
				if !ok {
					return ""
				}
				return r.value()
			},
			TTL: func(key string) time.Duration {
				_, left, _ := read(key)
				return left
			},
			Short: time.Second, // 300 ms was passed by a commit and the claim after it under load (CI run 86)
			Marks: true,
		}
	})
}

// Many goroutines through many pools (as many Caddy instances) claim one
// event ID at once: exactly one gets it, round after round, also when
// the row is an expired lease that they all try to take over (a mark:
// the one that gets it has Reclaimed).
func TestConcurrentClaimsManyPools(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	var stores []*Store
	for i := range 4 {
		s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", "8", "cleanup_interval", fmt.Sprintf("%dms", 1000+i)))
		stores = append(stores, s)
	}
	ctx := context.Background()
	for round := range 20 {
		key := fmt.Sprintf("evt_%d", round)
		want := dedup.Claimed
		if round%2 == 1 { // an expired lease to take over
			want = dedup.Reclaimed
			if _, _, err := stores[0].Claim(ctx, key, "old", time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		var claimed, inflight atomic.Int32
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, _, err := stores[g%len(stores)].Claim(ctx, key, fmt.Sprintf("tok%d", g), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				switch res {
				case want:
					claimed.Add(1)
				case dedup.InFlight:
					inflight.Add(1)
				}
			}()
		}
		wg.Wait()
		if claimed.Load() != 1 || inflight.Load() != 63 {
			t.Fatalf("round %d: %v %d, in flight %d; want 1 and 63", round, want, claimed.Load(), inflight.Load())
		}
	}
}

// A done record's every field is a column an application can read, and
// the value built from the columns is the record as encoded.
func TestDoneRecordColumns(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table))
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Date(2024, 12, 2, 12, 0, 1, 123456000, time.UTC), EventType: "payment_intent.succeeded",
		EventID: "evt_orig", Fingerprint: "00112233445566778899aabbccddeeff"}
	if _, _, err := s.Claim(ctx, "sangho_dedup:evt_1", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "sangho_dedup:evt_1", "tok", rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	got := srv.Psql(t, `SELECT event_id, event_type, to_char(processed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), fingerprint, message_event_id, lease_token IS NULL FROM `+table)
	want := "sangho_dedup:evt_1|payment_intent.succeeded|2024-12-02 12:00:01.123456|00112233445566778899aabbccddeeff|evt_orig|t"
	if got != want {
		t.Fatalf("row = %q, want %q", got, want)
	}
	e, err := s.Get(ctx, "sangho_dedup:evt_1")
	if err != nil || e.Value != rec.Encode() {
		t.Fatalf("get = %q, %v; want %q", e.Value, err, rec.Encode())
	}
}

// Expired rows are deleted in batches by one instance at a time: while
// another session holds the sweep's advisory lock, a sweep deletes
// nothing; then one deletes every expired row and no live one. A lease
// whose time ran out is kept as a mark for dedup.MarkFor, then swept.
func TestSweepBatchesOneInstanceAtATime(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "live", "tok", time.Hour); err != nil { // creates the table
		t.Fatal(err)
	}
	srv.Psql(t, `INSERT INTO `+table+` (event_id, processed_at, expires_at)
  SELECT 'old_' || g, now(), now() - interval '1 second' FROM generate_series(1, 2500) g`)
	srv.Psql(t, `INSERT INTO `+table+` (event_id, lease_token, expires_at) VALUES
  ('mark', 'tok', now() - interval '1 day'), ('old_mark', 'tok', now() - interval '8 days')`)
	other := connect(t, srv.DSN)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, s.db.lockKey()); err != nil {
		t.Fatal(err)
	}
	n, swept, err := s.db.sweep(ctx)
	if err != nil || swept || n != 0 {
		t.Fatalf("sweep while another instance sweeps = %d, %v, %v; want nothing", n, swept, err)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, s.db.lockKey()); err != nil {
		t.Fatal(err)
	}
	n, swept, err = s.db.sweep(ctx)
	if err != nil || !swept || n != 2501 {
		t.Fatalf("sweep = %d, %v, %v; want 2501 deleted", n, swept, err)
	}
	if got := srv.Psql(t, `SELECT string_agg(event_id, ',' ORDER BY event_id) FROM `+table); got != "live,mark" {
		t.Fatalf("rows left = %q, want live,mark", got)
	}
	if got := srv.Psql(t, `SELECT indexdef FROM pg_indexes WHERE tablename = '`+table+`' AND indexdef LIKE '%expires_at%'`); got != "" {
		t.Fatalf("index on expires_at %q: commits would not be HOT updates", got)
	}
}

// The background sweeper runs on its own at cleanup_interval: an
// expired done record goes, a lease whose time ran out stays (a mark).
func TestSweeperRuns(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "cleanup_interval", "50ms"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "gone", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "gone", "tok", dedup.DoneRecord{ProcessedAt: time.Now()}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "mark", "tok", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Psql(t, `SELECT string_agg(event_id, ',') FROM `+table) != "mark" {
		if time.Now().After(deadline) {
			t.Fatal("the expired record was not swept, or the mark was")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPostgresMarks: the previous release's rows are read as before (a
// lease whose time ran out becomes a mark: the same row), and the
// owner's release of its own mark deletes it.
func TestPostgresMarks(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "first", "tok", time.Hour); err != nil { // creates the table
		t.Fatal(err)
	}
	srv.Psql(t, `INSERT INTO `+table+` (event_id, lease_token, expires_at) VALUES ('old', 'oldtok', now() + interval '400 milliseconds')`)
	res, found, err := s.Claim(ctx, "old", "tok2", time.Minute)
	if err != nil || res != dedup.InFlight || found != "inflight:oldtok" {
		t.Fatalf("claim over a live lease of the previous release = %v, %q, %v; want in flight", res, found, err)
	}
	time.Sleep(500 * time.Millisecond)
	res, found, err = s.Claim(ctx, "old", "tok2", time.Minute)
	if err != nil || res != dedup.Reclaimed || found != "inflight:oldtok" {
		t.Fatalf("claim after it ran out = %v, %q, %v; want reclaimed", res, found, err)
	}

	if _, _, err := s.Claim(ctx, "own", "tok1", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if ok, err := s.Release(ctx, "own", "tok1"); err != nil || !ok {
		t.Fatalf("release of the own mark = %v, %v; want true", ok, err)
	}
	if res, _, err := s.Claim(ctx, "own", "tok2", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after the release = %v, %v; want claimed", res, err)
	}
}

// Many instances meeting a missing table at the same moment all create
// or find it: none fails. PostgreSQL's CREATE TABLE IF NOT EXISTS alone
// is not safe against itself (the loser fails on the row type's name,
// SQLSTATE 42710), which CI once met as 16 failed claims.
func TestConcurrentTableCreation(t *testing.T) {
	srv := pgtest.Start(t)
	for round := range 8 {
		table := uniqueTable()
		var stores []*Store
		for i := range 8 { // options that differ: a pool each, as in separate instances
			s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", "2", "cleanup_interval", fmt.Sprintf("%dms", 1000+i)))
			stores = append(stores, s)
		}
		var wg sync.WaitGroup
		var failed atomic.Int32
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := s.Claim(context.Background(), fmt.Sprintf("evt_%d", i), "tok", time.Minute); err != nil {
					failed.Add(1)
					t.Errorf("round %d, instance %d: %v", round, i, err)
				}
			}()
		}
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("round %d: %d of %d instances failed on a table created at once", round, failed.Load(), len(stores))
		}
	}
}

// The creation waits for the advisory lock of the table's name: while
// another session holds it, a first claim waits (here until its
// statement timeout), and goes through once it is released.
func TestTableCreationTakesTheLock(t *testing.T) {
	srv := pgtest.Start(t)
	s, _ := provision(t, storeJSON(srv.DSN, uniqueTable(), "statement_timeout", "300ms"))
	holder := connect(t, srv.DSN)
	if _, err := holder.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, s.db.ddlLockKey()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, _, err := s.Claim(context.Background(), "evt_1", "tok", time.Minute); err == nil {
		t.Fatalf("the claim created the table while another session held its creation lock")
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("the claim failed after %v, without waiting for the lock", d)
	}
	if _, err := holder.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, s.db.ddlLockKey()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second) // a failed check is retried after checkRetryEvery
	for {
		_, _, err := s.Claim(context.Background(), "evt_1", "tok", time.Minute)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the lock was released: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Another object holding the table's name (here an enum type) is the
// error it is, not a table "created meanwhile".
func TestTableNameTakenByAType(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	if _, err := connect(t, srv.DSN).Exec(context.Background(), `CREATE TYPE `+table+` AS ENUM ('a')`); err != nil {
		t.Fatal(err)
	}
	s, _ := provision(t, storeJSON(srv.DSN, table))
	_, _, err := s.Claim(context.Background(), "evt_1", "tok", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "creating table") || !strings.Contains(err.Error(), "42710") {
		t.Fatalf("claim with the table's name taken by a type: %v; want the creation's error (42710)", err)
	}
}

// A new event costs the database what the seed's recipe costs it plus
// one UPDATE: its claim is a plain INSERT … ON CONFLICT DO NOTHING and
// its commit a plain UPDATE (no CTE, no second lookup of the key); only
// a key that has a row runs the full claim statement. A commit retried
// after its answer was lost (it landed) writes the same record again
// and says the lease is no longer held; the event stays done.
func TestNewEventTakesTheLeanStatements(t *testing.T) {
	srv := pgtest.Start(t, "shared_preload_libraries=pg_stat_statements")
	srv.Psql(t, `CREATE EXTENSION pg_stat_statements`)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "cleanup_interval", "1h"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil { // creates the table
		t.Fatal(err)
	}
	srv.Psql(t, `SELECT pg_stat_statements_reset()`)
	ran := func() string {
		t.Helper()
		return srv.Psql(t, `SELECT string_agg(calls || ' ' || regexp_replace(query, '\s+', ' ', 'g'), E'\n' ORDER BY query)
  FROM pg_stat_statements WHERE query LIKE '%`+table+`%' AND query NOT LIKE '%pg_stat_statements%'`)
	}
	rec := dedup.DoneRecord{ProcessedAt: time.Now().UTC().Truncate(time.Microsecond), EventType: "t", Fingerprint: "x0123456789abcdef"}
	if res, _, err := s.Claim(ctx, "new", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	if held, err := s.Commit(ctx, "new", "tok", rec, time.Hour); err != nil || !held {
		t.Fatalf("commit = %v, %v", held, err)
	}
	got := ran()
	lines := strings.Split(got, "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "1 INSERT INTO ") || !strings.Contains(lines[0], "ON CONFLICT (event_id) DO NOTHING") ||
		!strings.HasPrefix(lines[1], "1 UPDATE ") || strings.Contains(got, "WITH") {
		t.Fatalf("a new event ran:\n%s\nwant one INSERT … DO NOTHING and one UPDATE, no CTE", got)
	}

	// The commit's answer lost, the commit retried with the same token.
	if held, err := s.Commit(ctx, "new", "tok", rec, time.Hour); err != nil || held {
		t.Fatalf("retried commit = %v, %v; want not held, no error", held, err)
	}
	if e, err := s.Get(ctx, "new"); err != nil || e.Value != rec.Encode() {
		t.Fatalf("after the retried commit: %q, %v; want %q", e.Value, err, rec.Encode())
	}
	if res, found, err := s.Claim(ctx, "new", "tok2", time.Minute); err != nil || res != dedup.AlreadyDone || found != rec.Encode() {
		t.Fatalf("claim after the retried commit = %v %q, %v; want done", res, found, err)
	}
	if got := ran(); !strings.Contains(got, "1 WITH cur AS") {
		t.Fatalf("a duplicate ran:\n%s\nwant the full claim statement once", got)
	}
}

// A retried claim (the token's own live lease) renews its lease. If the
// lease ran out, or another token took the key, between the claim that
// found it and the renewal, the claim runs again and answers from what
// the key holds then: a fresh lease of its own, or the other token's in
// flight. Never Claimed on a lease it no longer holds.
func TestRetriedClaimWhoseLeaseWentMeanwhile(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "cleanup_interval", "1h"))
	ctx := context.Background()
	expire := func(key string) {
		srv.Psql(t, fmt.Sprintf(`UPDATE %s SET expires_at = now() - interval '1 second' WHERE event_id = '%s'`, table, key))
	}
	for _, tc := range []struct {
		name      string
		meanwhile func(key string) // between the claim that found the lease and its renewal
		res       dedup.ClaimResult
		found     string
		holder    string
	}{
		{"ran out", expire, dedup.Claimed, "", "T"},
		{"another token took it", func(key string) {
			expire(key)
			if res, _, err := s.Claim(ctx, key, "U", time.Minute); err != nil || res != dedup.Reclaimed {
				t.Errorf("U's claim over T's mark = %v, %v; want reclaimed", res, err)
			}
		}, dedup.InFlight, "inflight:U", "U"},
		{"released", func(key string) {
			if ok, err := s.Release(ctx, key, "T"); err != nil || !ok {
				t.Errorf("T's release = %v, %v", ok, err)
			}
		}, dedup.Claimed, "", "T"},
	} {
		key := "retried " + tc.name
		if res, _, err := s.Claim(ctx, key, "T", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("%s: T's claim = %v, %v", tc.name, res, err)
		}
		calls := 0
		s.db.beforeRenew = func() {
			if calls++; calls == 1 {
				tc.meanwhile(key)
			}
		}
		res, found, err := s.Claim(ctx, key, "T", time.Hour)
		s.db.beforeRenew = nil
		if err != nil || res != tc.res || found != tc.found {
			t.Errorf("%s: T's retried claim = %v %q, %v; want %v %q", tc.name, res, found, err, tc.res, tc.found)
		}
		if calls != 1 {
			t.Errorf("%s: the renewal was reached %d times; want once", tc.name, calls)
		}
		live := srv.Psql(t, fmt.Sprintf(`SELECT lease_token || ' ' || (expires_at > now() + interval '50 seconds') FROM %s WHERE event_id = '%s'`, table, key))
		if want := tc.holder + " true"; live != want {
			t.Errorf("%s: the row holds %q; want %q (the holder's live lease)", tc.name, live, want)
		}
	}
}

// TestPostgresRefusesALateClaimOnASharedPool: as the Redis store's
// TestRedisRefusesALateClaimOnASharedClient, for the pool.
func TestPostgresRefusesALateClaimOnASharedPool(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	old, _ := provision(t, storeJSON(srv.DSN, table))
	cur, _ := provision(t, storeJSON(srv.DSN, table))
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old.Enter()
	defer old.Leave()
	if res, _, err := old.Claim(ctx, "late", "t", time.Minute); !errors.Is(err, storepool.ErrUnloaded) {
		t.Fatalf("late claim = %v, %v; want %v", res, err, storepool.ErrUnloaded)
	}
	if res, _, err := cur.Claim(ctx, "late", "t", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("the running config's claim = %v, %v; want claimed", res, err)
	}
}

// TestPostgresMarkOutlived: a lease whose time ran out longer ago than
// dedup.MarkFor, its row not swept yet, is no mark any more: Get says
// absent, and a claim over it is Claimed with nothing found, not
// Reclaimed (as on Redis, whose key has expired by then).
func TestPostgresMarkOutlived(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "first", "tok", time.Hour); err != nil { // creates the table
		t.Fatal(err)
	}
	srv.Psql(t, `INSERT INTO `+table+` (event_id, lease_token, expires_at) VALUES ('stale', 'oldtok', now() - interval '8 days')`)
	if e, err := s.Get(ctx, "stale"); err != nil || e.Value != "" {
		t.Fatalf("get of a lease past its mark's time = %+v, %v; want absent", e, err)
	}
	res, found, err := s.Claim(ctx, "stale", "tok2", time.Minute)
	if err != nil || res != dedup.Claimed || found != "" {
		t.Fatalf("claim over a lease past its mark's time = %v, %q, %v; want claimed, nothing found", res, found, err)
	}
}
