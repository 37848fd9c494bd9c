// Package dedupstoretest is the contract suite of dedup.Store: a store,
// this project's or a third party's, passes it in its own tests:
//
//	func TestContract(t *testing.T) {
//		dedupstoretest.Run(t, func(t *testing.T) dedupstoretest.Harness {
//			s := newMyStore(t)
//			return dedupstoretest.Harness{Store: s, Elapse: time.Sleep, Value: ..., TTL: ..., Short: 150 * time.Millisecond, Marks: true}
//		})
//	}
package dedupstoretest

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Harness is what the contract suite needs of a store under test.
type Harness struct {
	Store dedup.Store
	// Elapse lets d pass for the store (a fake clock, or real time).
	Elapse func(d time.Duration)
	// Value and TTL read a key's value ("" if absent) and remaining
	// time to live, behind the store's back: of a lease, its value
	// "inflight:<token>" and the time left until the lease's own expiry
	// (a store that keeps marks may store more beside them, such as the
	// mark's own time; the harness leaves that out).
	Value func(key string) string
	TTL   func(key string) time.Duration
	// Short is a TTL small enough to wait for.
	Short time.Duration
	// Marks: the store keeps a lease whose time ran out as the mark of
	// an attempt whose fate is unknown (for dedup.MarkFor), Get says
	// it is "unknown", and a claim over another token's mark returns
	// dedup.Reclaimed. Without Marks, the suite accepts Claimed there.
	Marks bool
}

// Run runs the contract suite, each subtest on a fresh harness.
func Run(t *testing.T, newHarness func(*testing.T) Harness) {
	ctx := context.Background()
	const lockTTL, retention = 30 * time.Second, 72 * time.Hour
	rec := dedup.DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "payment_intent.succeeded", Fingerprint: "0123456789abcdef0123456789abcdef"}

	approx := func(t *testing.T, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-2*time.Second {
			t.Fatalf("ttl = %v, want about %v", got, want)
		}
	}
	mustClaim := func(t *testing.T, h Harness, key, token string, ttl time.Duration, want dedup.ClaimResult) {
		t.Helper()
		got, _, err := h.Store.Claim(ctx, key, token, ttl)
		if err != nil {
			t.Fatalf("claim %s: %v", key, err)
		}
		if got != want {
			t.Fatalf("claim %s with %s = %v, want %v", key, token, got, want)
		}
	}

	t.Run("claim creates an in-flight lease with lock_ttl", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if v := h.Value("k"); v != "inflight:tok1" {
			t.Fatalf("value = %q", v)
		}
		approx(t, h.TTL("k"), lockTTL)
	})
	t.Run("second claim sees in flight and changes nothing", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		mustClaim(t, h, "k", "tok2", time.Hour, dedup.InFlight)
		if v := h.Value("k"); v != "inflight:tok1" {
			t.Fatalf("value = %q", v)
		}
		approx(t, h.TTL("k"), lockTTL)
	})
	t.Run("a retried claim with the same token is ours, and lives ttl again", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", 5*time.Second, dedup.Claimed)
		mustClaim(t, h, "k", "tok1", time.Minute, dedup.Claimed)
		approx(t, h.TTL("k"), time.Minute)
	})
	t.Run("renew checks the token and extends", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", 5*time.Second, dedup.Claimed)
		if ok, err := h.Store.Renew(ctx, "k", "other", time.Minute); err != nil || ok {
			t.Fatalf("renew with a foreign token = %v, %v; want false", ok, err)
		}
		approx(t, h.TTL("k"), 5*time.Second)
		if ok, err := h.Store.Renew(ctx, "k", "tok1", time.Minute); err != nil || !ok {
			t.Fatalf("renew = %v, %v; want true", ok, err)
		}
		approx(t, h.TTL("k"), time.Minute)
		if ok, _ := h.Store.Renew(ctx, "absent", "tok1", time.Minute); ok {
			t.Fatal("renew of an absent key succeeded")
		}
		if v := h.Value("absent"); v != "" {
			t.Fatalf("renew created a key: %q", v)
		}
	})
	t.Run("commit writes the done record with retention", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		held, err := h.Store.Commit(ctx, "k", "tok1", rec, retention)
		if err != nil || !held {
			t.Fatalf("commit = %v, %v; want held", held, err)
		}
		// either form, byte for byte: records a later version must read
		want := `done:{"processed_at":"2024-12-02T12:00:01Z","event_type":"payment_intent.succeeded","fingerprint":"0123456789abcdef0123456789abcdef"}`
		compact := "done:\x01\x01\x93\x87=\xe5\xe8\x01#Eg\x89\xab\xcd\xef\x01#Eg\x89\xab\xcd\xefpayment_intent.succeeded"
		if v := h.Value("k"); v != want && v != compact {
			t.Fatalf("value = %q, want %q or %q", v, want, compact)
		}
		approx(t, h.TTL("k"), retention)
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.AlreadyDone)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.AlreadyDone)
	})
	t.Run("commit after the lease was lost records done and says so", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		held, err := h.Store.Commit(ctx, "k", "tok2", rec, retention)
		if err != nil || held {
			t.Fatalf("commit with a foreign token = %v, %v; want not held", held, err)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, dedup.AlreadyDone)
		// and a commit on a key that expired meanwhile
		held, err = h.Store.Commit(ctx, "gone", "tok1", rec, retention)
		if err != nil || held {
			t.Fatalf("commit of an absent key = %v, %v; want not held", held, err)
		}
		mustClaim(t, h, "gone", "tok3", lockTTL, dedup.AlreadyDone)
	})
	t.Run("release checks the token and deletes", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if ok, err := h.Store.Release(ctx, "k", "tok2"); err != nil || ok {
			t.Fatalf("release with a foreign token = %v, %v; want false", ok, err)
		}
		if v := h.Value("k"); v != "inflight:tok1" {
			t.Fatalf("foreign release changed the key: %q", v)
		}
		if ok, err := h.Store.Release(ctx, "k", "tok1"); err != nil || !ok {
			t.Fatalf("release = %v, %v; want true", ok, err)
		}
		if v := h.Value("k"); v != "" {
			t.Fatalf("key still there after release: %q", v)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Claimed)
	})
	t.Run("release never deletes a done record", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if _, err := h.Store.Commit(ctx, "k", "tok1", rec, retention); err != nil {
			t.Fatal(err)
		}
		if ok, err := h.Store.Release(ctx, "k", "tok1"); err != nil || ok {
			t.Fatalf("release after commit = %v, %v; want false", ok, err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.AlreadyDone)
	})
	// The crash window (dedup.Reclaimed, dedup.MarkFor): a lease whose
	// time ran out is another attempt whose fate nobody knows.
	reclaimed := func(h Harness) dedup.ClaimResult {
		if h.Marks {
			return dedup.Reclaimed
		}
		return dedup.Claimed
	}
	t.Run("an expired lease of another token is reclaimed, and its owner can neither renew nor release it", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		if ok, _ := h.Store.Renew(ctx, "k", "tok1", lockTTL); ok {
			t.Fatal("renewed an expired lease")
		}
		res, found, err := h.Store.Claim(ctx, "k", "tok2", lockTTL)
		if err != nil || res != reclaimed(h) {
			t.Fatalf("claim over an expired lease = %v, %v; want %v", res, err, reclaimed(h))
		}
		if found != "" && found != "inflight:tok1" {
			t.Fatalf("claim over an expired lease found %q; want the lease it replaced or nothing", found)
		}
		if ok, _ := h.Store.Renew(ctx, "k", "tok1", lockTTL); ok {
			t.Fatal("the first owner renewed the second owner's lease")
		}
		if ok, _ := h.Store.Release(ctx, "k", "tok1"); ok {
			t.Fatal("the first owner released the second owner's lease")
		}
		if v := h.Value("k"); v != "inflight:tok2" {
			t.Fatalf("value = %q, want the second owner's lease", v)
		}
		approx(t, h.TTL("k"), lockTTL)
		mustClaim(t, h, "k", "tok3", lockTTL, dedup.InFlight)
		if ok, err := h.Store.Renew(ctx, "k", "tok2", time.Minute); err != nil || !ok {
			t.Fatalf("renew of the reclaimed lease = %v, %v; want true", ok, err)
		}
		if held, err := h.Store.Commit(ctx, "k", "tok2", rec, retention); err != nil || !held {
			t.Fatalf("commit of the reclaimed lease = %v, %v; want held", held, err)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, dedup.AlreadyDone)
	})
	t.Run("concurrent claims over an expired lease: exactly one reclaims it", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "race", "tok0", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		var won, inflight atomic.Int32
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, _, err := h.Store.Claim(ctx, "race", "tok"+strings.Repeat("x", i+1), lockTTL)
				if err != nil {
					t.Error(err)
					return
				}
				switch res {
				case reclaimed(h):
					won.Add(1)
				case dedup.InFlight:
					inflight.Add(1)
				}
			}()
		}
		wg.Wait()
		if won.Load() != 1 || inflight.Load() != 19 {
			t.Fatalf("%v %d, in flight %d; want 1 and 19", reclaimed(h), won.Load(), inflight.Load())
		}
	})
	t.Run("a lease whose time ran out is kept as a mark, state unknown", func(t *testing.T) {
		h := newHarness(t)
		if !h.Marks {
			t.Skip("the store keeps no marks (Harness.Marks)")
		}
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		e, err := h.Store.Get(ctx, "k")
		if err != nil || !e.Mark || e.State() != "unknown" || e.Value != "inflight:tok1" || e.ExpiresAt.IsZero() {
			t.Fatalf("get of an expired lease = %+v (state %s), %v; want a mark (unknown), the lease, its expiry", e, e.State(), err)
		}
		if v := h.Value("k"); v != "inflight:tok1" {
			t.Fatalf("value of an expired lease = %q; want it kept", v)
		}
		if d := h.TTL("k"); d > 0 {
			t.Fatalf("ttl of an expired lease = %v; want its own time run out", d)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Reclaimed)
	})
	// The handler holds a marked delivery it did not process (the backend
	// answered non-2xx or was never reached) instead of releasing it:
	// the lease that replaced the mark must run out into a mark again,
	// so that the next attempt, too, is marked.
	t.Run("a lease over a mark that runs out is a mark again", func(t *testing.T) {
		h := newHarness(t)
		if !h.Marks {
			t.Skip("the store keeps no marks (Harness.Marks)")
		}
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		mustClaim(t, h, "k", "tok2", h.Short, dedup.Reclaimed)
		h.Elapse(h.Short + h.Short/2)
		e, err := h.Store.Get(ctx, "k")
		if err != nil || !e.Mark || e.State() != "unknown" || e.Value != "inflight:tok2" {
			t.Fatalf("get after the reclaimed lease ran out = %+v (state %s), %v; want a mark (unknown) of the second lease", e, e.State(), err)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, dedup.Reclaimed)
		mustClaim(t, h, "k", "tok4", lockTTL, dedup.InFlight)
	})
	t.Run("a released lease leaves no mark", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		if ok, err := h.Store.Release(ctx, "k", "tok1"); err != nil || !ok {
			t.Fatalf("release = %v, %v; want true", ok, err)
		}
		h.Elapse(h.Short + h.Short/2)
		if e, err := h.Store.Get(ctx, "k"); err != nil || e.State() != "absent" {
			t.Fatalf("get after release = %+v, %v; want absent", e, err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Claimed)
	})
	t.Run("a commit replaces the mark", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		// The owner commits late (its renewals failed): the backend did
		// process the event, so it is done whatever the lease says.
		if _, err := h.Store.Commit(ctx, "k", "tok1", rec, retention); err != nil {
			t.Fatal(err)
		}
		e, err := h.Store.Get(ctx, "k")
		if err != nil || e.State() != "done" || !isRecord(e.Value, rec) {
			t.Fatalf("get after a commit over the mark = %+v, %v; want done", e, err)
		}
		approx(t, h.TTL("k"), retention)
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.AlreadyDone)
	})
	t.Run("forget keeps a mark without force and deletes it with force", func(t *testing.T) {
		h := newHarness(t)
		if !h.Marks {
			t.Skip("the store keeps no marks (Harness.Marks)")
		}
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		if e, deleted, err := h.Store.Forget(ctx, "k", false); err != nil || deleted || e.State() != "unknown" {
			t.Fatalf("forget of a mark without force = %+v, %v, %v; want unknown, kept", e, deleted, err)
		}
		if v := h.Value("k"); v != "inflight:tok1" {
			t.Fatalf("forget without force removed the mark: %q", v)
		}
		if e, deleted, err := h.Store.Forget(ctx, "k", true); err != nil || !deleted || e.State() != "unknown" {
			t.Fatalf("forced forget of a mark = %+v, %v, %v; want unknown, deleted", e, deleted, err)
		}
		if v := h.Value("k"); v != "" {
			t.Fatalf("key still there after a forced forget: %q", v)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Claimed)
	})
	// A claim retried with the same token (its first attempt's answer
	// was lost) is the same delivery, which passed nothing on yet: its
	// own lease, live or run out, is Claimed, never Reclaimed, and lives
	// lock_ttl again.
	t.Run("a retried claim over its own expired lease is claimed, with a fresh lease", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", h.Short, dedup.Claimed)
		h.Elapse(h.Short + h.Short/2)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		e, err := h.Store.Get(ctx, "k")
		if err != nil || e.State() != "in_flight" || e.Value != "inflight:tok1" {
			t.Fatalf("get after the retried claim = %+v, %v; want in flight", e, err)
		}
		approx(t, h.TTL("k"), lockTTL)
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.InFlight)
		if ok, err := h.Store.Renew(ctx, "k", "tok1", time.Minute); err != nil || !ok {
			t.Fatalf("renew after the retried claim = %v, %v; want true", ok, err)
		}
	})
	t.Run("a done record expires after retention", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if _, err := h.Store.Commit(ctx, "k", "tok1", rec, h.Short); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.AlreadyDone)
		h.Elapse(h.Short + h.Short/2)
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Claimed)
	})
	t.Run("concurrent claims: exactly one wins", func(t *testing.T) {
		h := newHarness(t)
		var claimed, inflight atomic.Int32
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, _, err := h.Store.Claim(ctx, "race", "tok"+strings.Repeat("x", i), lockTTL)
				if err != nil {
					t.Error(err)
					return
				}
				switch res {
				case dedup.Claimed:
					claimed.Add(1)
				case dedup.InFlight:
					inflight.Add(1)
				}
			}()
		}
		wg.Wait()
		if claimed.Load() != 1 || inflight.Load() != 49 {
			t.Fatalf("claimed %d, in flight %d; want 1 and 49", claimed.Load(), inflight.Load())
		}
	})
	t.Run("claim returns what it found", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if res, found, err := h.Store.Claim(ctx, "k", "tok2", lockTTL); err != nil || res != dedup.InFlight || found != "inflight:tok1" {
			t.Fatalf("claim of a leased key = %v, %q, %v; want in flight, the lease", res, found, err)
		}
		fp := dedup.DoneRecord{ProcessedAt: rec.ProcessedAt, EventType: rec.EventType, Fingerprint: "00112233445566778899aabbccddeeff"}
		if _, err := h.Store.Commit(ctx, "k", "tok1", fp, retention); err != nil {
			t.Fatal(err)
		}
		res, found, err := h.Store.Claim(ctx, "k", "tok2", lockTTL)
		if err != nil || res != dedup.AlreadyDone || !isRecord(found, fp) {
			t.Fatalf("claim of a done key = %v, %q, %v; want done, %q", res, found, err, fp.EncodeCompact())
		}
		if got := dedup.Fingerprint(found); got != fp.Fingerprint {
			t.Fatalf("fingerprint read back = %q", got)
		}
	})
	t.Run("get tells absent, in flight and done, with the expiry", func(t *testing.T) {
		h := newHarness(t)
		if e, err := h.Store.Get(ctx, "k"); err != nil || e.State() != "absent" {
			t.Fatalf("get of an absent key = %+v, %v", e, err)
		}
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		e, err := h.Store.Get(ctx, "k")
		if err != nil || e.State() != "in_flight" || e.Value != "inflight:tok1" || e.ExpiresAt.IsZero() {
			t.Fatalf("get of a leased key = %+v, %v", e, err)
		}
		leaseExpiry := e.ExpiresAt
		if _, err := h.Store.Commit(ctx, "k", "tok1", rec, retention); err != nil {
			t.Fatal(err)
		}
		e, err = h.Store.Get(ctx, "k")
		if err != nil || e.State() != "done" || !isRecord(e.Value, rec) {
			t.Fatalf("get of a done key = %+v, %v", e, err)
		}
		// both expiries count from the store's clock
		if d := e.ExpiresAt.Sub(leaseExpiry) - (retention - lockTTL); d > 2*time.Second || d < -2*time.Second {
			t.Fatalf("done record expires %v after the lease would have, want about %v", e.ExpiresAt.Sub(leaseExpiry), retention-lockTTL)
		}
		if h.Value("k") != e.Value {
			t.Fatal("get changed the key")
		}
	})
	t.Run("forget deletes a done record, a lease only with force", func(t *testing.T) {
		h := newHarness(t)
		if e, deleted, err := h.Store.Forget(ctx, "absent", false); err != nil || deleted || e.Value != "" {
			t.Fatalf("forget of an absent key = %+v, %v, %v", e, deleted, err)
		}
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		if e, deleted, err := h.Store.Forget(ctx, "k", false); err != nil || deleted || e.State() != "in_flight" {
			t.Fatalf("forget of a leased key without force = %+v, %v, %v; want in flight, kept", e, deleted, err)
		}
		if h.Value("k") != "inflight:tok1" {
			t.Fatal("forget without force removed a lease")
		}
		if e, deleted, err := h.Store.Forget(ctx, "k", true); err != nil || !deleted || e.State() != "in_flight" {
			t.Fatalf("forced forget of a leased key = %+v, %v, %v; want deleted", e, deleted, err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.Claimed)
		if _, err := h.Store.Commit(ctx, "k", "tok2", rec, retention); err != nil {
			t.Fatal(err)
		}
		e, deleted, err := h.Store.Forget(ctx, "k", false)
		if err != nil || !deleted || !isRecord(e.Value, rec) {
			t.Fatalf("forget of a done key = %+v, %v, %v; want the record, deleted", e, deleted, err)
		}
		if v := h.Value("k"); v != "" {
			t.Fatalf("key still there after forget: %q", v)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, dedup.Claimed)
	})
	// A store used directly (not through a handler's Validate) may be
	// given the longest Duration: its expiry saturates, never wraps into
	// the past. (Found by review: the file store wrote expiries past 2262
	// as negative Unix nanoseconds, so every record was already expired.)
	t.Run("the longest ttl never wraps into the past", func(t *testing.T) {
		h := newHarness(t)
		const forever = time.Duration(math.MaxInt64)
		mustClaim(t, h, "k", "tok1", forever, dedup.Claimed)
		mustClaim(t, h, "k", "tok2", lockTTL, dedup.InFlight)
		if held, err := h.Store.Commit(ctx, "k", "tok1", rec, forever); err != nil || !held {
			t.Fatalf("commit = %v, %v; want held", held, err)
		}
		for i := range 3 {
			mustClaim(t, h, "k", "tok"+strconv.Itoa(3+i), lockTTL, dedup.AlreadyDone)
		}
		e, err := h.Store.Get(ctx, "k")
		if err != nil || e.State() != "done" || !e.ExpiresAt.After(time.Now().AddDate(200, 0, 0)) {
			t.Fatalf("get = %+v, %v; want done, expiring centuries from now", e, err)
		}
	})
	t.Run("event types are stored as JSON strings", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, dedup.Claimed)
		odd := dedup.DoneRecord{ProcessedAt: rec.ProcessedAt, EventType: "a\"b\\c\n"}
		if _, err := h.Store.Commit(ctx, "k", "tok1", odd, retention); err != nil {
			t.Fatal(err)
		}
		want := `done:{"processed_at":"2024-12-02T12:00:01Z","event_type":"a\"b\\c\n"}`
		if v := h.Value("k"); v != want {
			t.Fatalf("value = %q, want %q", v, want)
		}
	})
}

// isRecord reports whether a store's value is rec, in either of the
// forms a store may write: dedup.DoneRecord.Encode or EncodeCompact.
func isRecord(val string, rec dedup.DoneRecord) bool {
	return val == rec.Encode() || val == rec.EncodeCompact()
}
