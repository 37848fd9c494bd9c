package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// waitFor polls cond for at most 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	waitFor(t, "both caches live", func() bool { return a.db.cache.live.Load() && b.db.cache.live.Load() })

	processed(t, a, "evt_1")
	if res := claimResult(t, b, "evt_1"); res != dedup.AlreadyDone {
		t.Fatalf("B's first delivery: %v, want already done", res)
	}
	hits := b.db.cache.hits.Load()
	if res := claimResult(t, b, "evt_1"); res != dedup.AlreadyDone || b.db.cache.hits.Load() != hits+1 {
		t.Fatalf("B's second delivery: %v, cache hits %d→%d: not answered from the cache", res, hits, b.db.cache.hits.Load())
	}

	inv := b.db.cache.invalidated.Load()
	if _, deleted, err := a.Forget(context.Background(), "evt_1", false); err != nil || !deleted {
		t.Fatalf("forget on A: %v %v", deleted, err)
	}
	waitFor(t, "B's listener hears A's forget", func() bool { return b.db.cache.invalidated.Load() > inv })
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
	waitFor(t, "cache live", func() bool { return c.live.Load() })
	learn := func(key string) {
		t.Helper()
		processed(t, s, key)
		claimResult(t, s, key)
		hits := c.hits.Load()
		if claimResult(t, s, key) != dedup.AlreadyDone || c.hits.Load() != hits+1 {
			t.Fatalf("%s not answered from the cache", key)
		}
	}

	learn("evt_1")
	// the statement docs/postgres.md gives for rows deleted by hand
	srv.Psql(t, "DELETE FROM "+table+"; SELECT pg_notify('sangho_dedup_forget_' || left(md5('\"public\".\""+table+"\"'), 16), '*')")
	waitFor(t, "the cache emptied by '*'", func() bool { return claimResult(t, s, "evt_1") == dedup.Claimed })

	learn("evt_2")
	conns := s.db.lis.conns.Load()
	srv.Psql(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' OR query = 'SELECT 1'")
	waitFor(t, "the cache off after the listener's connection was lost", func() bool { return !c.live.Load() })
	srv.Psql(t, "DELETE FROM "+table+" WHERE event_id = 'evt_2'") // no notification: the listener is down
	waitFor(t, "the listener back", func() bool { return s.db.lis.conns.Load() > conns && c.live.Load() })
	if res := claimResult(t, s, "evt_2"); res != dedup.Claimed {
		t.Fatalf("a record deleted while the listener was down: %v, want claimed (the cache was emptied)", res)
	}
}
