package postgres

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
)

// waitFor waits for cond, at most 5 s (poll.Until).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 5*time.Second, what, cond)
}

// processed claims and commits key through s.
func processed(t *testing.T, s *Store, key string) {
	t.Helper()
	ctx := context.Background()
	if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim %s: %v %v", key, res, err)
	}
	if _, err := s.Commit(ctx, key, "tok", dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "t"}, time.Hour); err != nil {
		t.Fatal(err)
	}
}

func claimResult(t *testing.T, s *Store, key string) dedup.ClaimResult {
	t.Helper()
	res, _, err := s.Claim(context.Background(), key, "tok2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Two instances with local_cache on one table: B answers a duplicate
// from its cache; an event forgotten through A is processed by B's next
// delivery (A's forget notifies, B's listener drops the record).
func TestLocalCacheForgetOnAnotherInstance(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	a, _ := provision(t, storeJSON(srv.DSN, table, "local_cache", "100", "max_conns", "3"))
	b, _ := provision(t, storeJSON(srv.DSN, table, "local_cache", "100", "max_conns", "4"))
	if a.db == b.db {
		t.Fatal("one pool: not two instances")
	}
	waitFor(t, "both caches live", func() bool { return a.db.cache.Live() && b.db.cache.Live() })

	processed(t, a, "evt_1")
	if res := claimResult(t, b, "evt_1"); res != dedup.AlreadyDone {
		t.Fatalf("B's first delivery: %v, want already done", res)
	}
	hits := b.db.cache.Hits()
	if res := claimResult(t, b, "evt_1"); res != dedup.AlreadyDone || b.db.cache.Hits() != hits+1 {
		t.Fatalf("B's second delivery: %v, cache hits %d→%d: not answered from the cache", res, hits, b.db.cache.Hits())
	}

	inv := b.db.cache.Invalidated()
	if _, deleted, err := a.Forget(context.Background(), "evt_1", false); err != nil || !deleted {
		t.Fatalf("forget on A: %v %v", deleted, err)
	}
	waitFor(t, "B's listener hears A's forget", func() bool { return b.db.cache.Invalidated() > inv })
	if res := claimResult(t, b, "evt_1"); res != dedup.Claimed {
		t.Fatalf("B's delivery after the forget on A: %v, want claimed (processed again)", res)
	}

	// A forget through B drops B's own entry at once.
	processed(t, b, "evt_2")
	claimResult(t, b, "evt_2") // learned
	if _, deleted, err := b.Forget(context.Background(), "evt_2", false); err != nil || !deleted {
		t.Fatalf("forget on B: %v %v", deleted, err)
	}
	if res := claimResult(t, b, "evt_2"); res != dedup.Claimed {
		t.Fatalf("B's delivery right after its own forget: %v, want claimed", res)
	}
}

// A notification "*" (after rows were deleted by hand) empties every
// cache; a lost listening connection empties the cache and stops it
// serving until the listener is back.
func TestLocalCacheFlushAndLostListener(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "local_cache", "100"))
	c := s.db.cache
	waitFor(t, "cache live", func() bool { return c.Live() })
	learn := func(key string) {
		t.Helper()
		processed(t, s, key)
		claimResult(t, s, key)
		hits := c.Hits()
		if claimResult(t, s, key) != dedup.AlreadyDone || c.Hits() != hits+1 {
			t.Fatalf("%s not answered from the cache", key)
		}
	}

	learn("evt_1")
	// the statement docs/postgres.md gives for rows deleted by hand
	srv.Psql(t, "DELETE FROM "+table+"; SELECT pg_notify('sangho_dedup_forget_' || left(md5('\"public\".\""+table+"\"'), 16), '*')")
	waitFor(t, "the cache emptied by '*'", func() bool { return claimResult(t, s, "evt_1") == dedup.Claimed })

	learn("evt_2")
	conns := s.db.lis.conns()
	srv.Psql(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' OR query = 'SELECT 1'")
	waitFor(t, "the cache off after the listener's connection was lost", func() bool { return !c.Live() })
	srv.Psql(t, "DELETE FROM "+table+" WHERE event_id = 'evt_2'") // no notification: the listener is down
	waitFor(t, "the listener back", func() bool { return s.db.lis.conns() > conns && c.Live() })
	if res := claimResult(t, s, "evt_2"); res != dedup.Claimed {
		t.Fatalf("a record deleted while the listener was down: %v, want claimed (the cache was emptied)", res)
	}
}

// TestLocalCacheKeepsTheHotDuplicate: a full cache drops the entry least
// recently used (CLOCK), not an arbitrary one: an event redelivered
// again and again stays answered from the cache while other processed
// events pass through it. (Before the stores shared their cache, this
// store dropped an arbitrary entry, the hot one half the time here;
// checked to fail that way.)
func TestLocalCacheKeepsTheHotDuplicate(t *testing.T) {
	srv := pgtest.Start(t)
	s, _ := provision(t, storeJSON(srv.DSN, uniqueTable(), "local_cache", "2"))
	c := s.db.cache
	waitFor(t, "cache live", c.Live)
	processed(t, s, "hot")
	claimResult(t, s, "hot") // learned
	for i := range 20 {
		hits := c.Hits()
		if res := claimResult(t, s, "hot"); res != dedup.AlreadyDone || c.Hits() != hits+1 {
			t.Fatalf("the hot duplicate not answered from the cache after %d other events: %v", i, res)
		}
		key := "evt_" + strconv.Itoa(i)
		processed(t, s, key)
		claimResult(t, s, key) // learned: the cache is full
	}
}

// TestLocalCacheDroppedByAFailedForget: a forget through this store that
// fails (its delete may have committed with the answer lost) drops the
// entry at once, as a forget that succeeds does, rather than leave it to
// a notification that may never come.
func TestLocalCacheDroppedByAFailedForget(t *testing.T) {
	srv := pgtest.Start(t)
	s, _ := provision(t, storeJSON(srv.DSN, uniqueTable(), "local_cache", "100"))
	c := s.db.cache
	waitFor(t, "cache live", c.Live)
	processed(t, s, "evt_1")
	claimResult(t, s, "evt_1") // learned
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Forget(ctx, "evt_1", false); err == nil {
		t.Fatal("a forget with its context cancelled did not fail")
	}
	if _, ok := c.Get(cacheKey("evt_1")); ok {
		t.Fatal("the cache still serves a record whose forget failed")
	}
}

// invalidateAfterClaimRead is a pgx tracer that, when the claim
// statement's row has been read, invalidates key in the cache: a
// forget's notification arriving between the claim's read and its Put.
type invalidateAfterClaimRead struct {
	s   *Store
	key string
}

func (tr invalidateAfterClaimRead) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tr, d.SQL == tr.s.db.sql.claim)
}

func (tr invalidateAfterClaimRead) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if claim, _ := ctx.Value(tr).(bool); claim {
		invalidate(tr.s.db.cache, cacheKey(tr.key))
	}
}

// TestLocalCacheRefusesAReadOlderThanAForget: a done record read before
// a forget's notification reached this instance is not cached (the
// claim puts it with the cache generation of before its read): else the
// forgotten event's next delivery is answered "done" from the cache and
// never processed.
func TestLocalCacheRefusesAReadOlderThanAForget(t *testing.T) {
	srv := pgtest.Start(t)
	s, _ := provision(t, storeJSON(srv.DSN, uniqueTable(), "local_cache", "100"))
	c := s.db.cache
	waitFor(t, "cache live", c.Live)
	processed(t, s, "evt_f")
	s.db.opts.config.ConnConfig.Tracer = invalidateAfterClaimRead{s: s, key: "evt_f"}
	s.db.pool.Reset() // new connections take the tracer
	if res := claimResult(t, s, "evt_f"); res != dedup.AlreadyDone {
		t.Fatalf("claim of a processed event = %v", res)
	}
	if c.Has(cacheKey("evt_f")) {
		t.Fatal("a done record read before an invalidation was cached")
	}
}
