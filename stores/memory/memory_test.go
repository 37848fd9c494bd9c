package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup/dedupstoretest"
	"github.com/sangho/caddy-sangho-dedup/internal/memtable"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/testclock"
)

func harness(t *testing.T) dedupstoretest.Harness {
	// At the wall clock's time: Entry.State compares expiries with it.
	clock := testclock.New()
	clock.Advance(time.Since(clock.Now()))
	st := memtable.New(clock.Now, time.Hour)
	t.Cleanup(func() { st.Destruct() })
	m := &Store{state: st}
	return dedupstoretest.Harness{
		Store:  m,
		Marks:  true,
		Elapse: clock.Advance,
		Value:  func(key string) string { e, _ := st.Lookup(key); return e.Value },
		TTL: func(key string) time.Duration {
			e, ok := st.Lookup(key)
			if !ok {
				return 0
			}
			return e.ExpiresAt.Sub(clock.Now())
		},
		Short: time.Second,
	}
}

func TestStoreContract(t *testing.T) { dedupstoretest.Run(t, harness) }

func TestStateSharedAcrossReloads(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := new(Store)
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, "reload-k", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	b := new(Store) // the new config is provisioned before the old one is cleaned up
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	a.Cleanup()
	if res, _, _ := b.Claim(ctx, "reload-k", "tok2", time.Minute); res != dedup.InFlight {
		t.Fatalf("after reload the claim was forgotten: %v", res)
	}
	b.Cleanup()
	c := new(Store) // every user gone: a fresh state
	if err := c.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Cleanup()
	if res, _, _ := c.Claim(ctx, "reload-k", "tok3", time.Minute); res != dedup.Claimed {
		t.Fatalf("state outlived its last user: %v", res)
	}
}

// TestRedisWaitReplicas: with wait_replicas the done record is on the
// replica when Commit returns; when fewer replicas acknowledge it, the

// TestMarks: a lease whose time ran out is kept for dedup.MarkFor as the
// mark of an attempt whose fate is unknown. Another token's claim over it
// is Reclaimed, Get says "unknown" (with the lease's own expiry), a
// forget needs force, a release leaves no mark, a commit replaces it,
// and marks are swept after MarkFor.
func TestMarks(t *testing.T) {
	// Entry.State reads the wall clock: the test's clock starts an hour
	// ago, so that a lease of a second is past by then, and one of a
	// day (live) is not.
	clock := testclock.New()
	clock.Advance(time.Since(clock.Now()) - time.Hour)
	const live = 24 * time.Hour
	st := memtable.New(clock.Now, time.Hour)
	defer st.Destruct()
	m := &Store{state: st}
	ctx := context.Background()
	claim := func(key, tok string, ttl time.Duration, want dedup.ClaimResult) string {
		t.Helper()
		res, found, err := m.Claim(ctx, key, tok, ttl)
		if err != nil || res != want {
			t.Fatalf("claim %s with %s = %v, %v; want %v", key, tok, res, err, want)
		}
		return found
	}
	state := func(key, want string) dedup.Entry {
		t.Helper()
		e, err := m.Get(ctx, key)
		if err != nil || e.State() != want {
			t.Fatalf("get %s = %+v (%s), %v; want %s", key, e, e.State(), err, want)
		}
		return e
	}
	leaseExpiry := clock.Now().Add(time.Second)
	claim("k", "tok1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	if e := state("k", "unknown"); e.Value != "inflight:tok1" || !e.ExpiresAt.Equal(leaseExpiry) {
		t.Fatalf("mark = %+v; want the lease, with its own expiry %v", e, leaseExpiry)
	}
	if ok, err := m.Renew(ctx, "k", "tok1", time.Minute); err != nil || ok {
		t.Fatalf("renew of a mark = %v, %v; want false", ok, err)
	}
	if e, deleted, err := m.Forget(ctx, "k", false); err != nil || deleted || e.State() != "unknown" {
		t.Fatalf("forget of a mark without force = %+v, %v, %v; want kept", e, deleted, err)
	}
	if found := claim("k", "tok2", live, dedup.Reclaimed); found != "inflight:tok1" {
		t.Fatalf("reclaim found %q; want the mark", found)
	}
	state("k", "in_flight")
	claim("k", "tok3", live, dedup.InFlight)
	if ok, err := m.Release(ctx, "k", "tok2"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	state("k", "absent") // a release leaves no mark

	// The owner's own claim over its mark is a retried claim: Claimed.
	claim("own", "tok1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	claim("own", "tok1", live, dedup.Claimed)
	state("own", "in_flight")

	// The owner's release of its own mark leaves none (the backend said
	// it failed).
	claim("rel", "tok1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	if ok, err := m.Release(ctx, "rel", "tok1"); err != nil || !ok {
		t.Fatalf("release of the owner's mark = %v, %v; want true", ok, err)
	}
	claim("rel", "tok2", live, dedup.Claimed)

	// A commit replaces a mark, whoever commits.
	claim("c", "tok1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	if _, err := m.Commit(ctx, "c", "tok9", dedup.DoneRecord{ProcessedAt: clock.Now()}, time.Hour); err != nil {
		t.Fatal(err)
	}
	state("c", "done")
	claim("c", "tok2", live, dedup.AlreadyDone)

	// A forced forget deletes a mark.
	claim("f", "tok1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	if e, deleted, err := m.Forget(ctx, "f", true); err != nil || !deleted || e.State() != "unknown" {
		t.Fatalf("forced forget of a mark = %+v, %v, %v; want deleted", e, deleted, err)
	}
	claim("f", "tok2", live, dedup.Claimed)

	// Marks are kept MarkFor after the lease's expiry, then swept.
	claim("old", "tok1", time.Second, dedup.Claimed)
	clock.Advance(time.Second + dedup.MarkFor - time.Millisecond)
	if e, _ := m.Get(ctx, "old"); e.Value != "inflight:tok1" {
		t.Fatalf("mark gone before MarkFor: %+v", e)
	}
	n := st.Len()
	clock.Advance(2 * time.Millisecond)
	state("old", "absent")
	if swept := st.Sweep(); swept < 1 || st.Len() != n-swept {
		t.Fatalf("swept %d of %d entries; want the old mark at least", swept, n)
	}
	claim("old", "tok2", live, dedup.Claimed)
}
