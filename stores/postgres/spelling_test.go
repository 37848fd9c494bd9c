package postgres

import (
	"context"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/pgtest"
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
	if a.StateID() != b.StateID() {
		t.Fatalf("state IDs differ: %q %q", a.StateID(), b.StateID())
	}
	waitFor(t, "both caches live", func() bool { return a.db.cache.live.Load() && b.db.cache.live.Load() })
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
