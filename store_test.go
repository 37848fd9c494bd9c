package sanghodedup

import (
	"context"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// fakeClock is a swappable clock for time-dependent logic.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1733140800, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// storeHarness is what the contract suite needs of a store under test.
type storeHarness struct {
	store Store
	// elapse lets d pass for the store (fake clock, or real time).
	elapse func(d time.Duration)
	// value and ttl read a key's raw value ("" if absent) and remaining time to live.
	value func(key string) string
	ttl   func(key string) time.Duration
	// short is a TTL small enough to wait for.
	short time.Duration
}

func memoryHarness(t *testing.T) storeHarness {
	clock := newFakeClock()
	st := newMemState(clock.Now, time.Hour)
	t.Cleanup(func() { st.Destruct() })
	m := &MemoryStore{state: st}
	lookup := func(key string) (memEntry, bool) {
		sh := st.shard(key)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return st.get(sh, key, clock.Now())
	}
	return storeHarness{
		store:  m,
		elapse: clock.Advance,
		value:  func(key string) string { e, _ := lookup(key); return e.val },
		ttl: func(key string) time.Duration {
			e, ok := lookup(key)
			if !ok {
				return 0
			}
			return e.expires.Sub(clock.Now())
		},
		short: time.Second,
	}
}

// startRedis starts a real redis-server on a free loopback port for one
// test (stopped at cleanup), or fails the test if there is none.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

func freePort(t testing.TB) int { return redistest.FreePort(t) }

func provisionRedisStore(t testing.TB, s *RedisStore) *RedisStore {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatalf("provisioning redis store: %v", err)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("validating redis store: %v", err)
	}
	t.Cleanup(func() { s.Cleanup() })
	return s
}

func redisHarness(t *testing.T) storeHarness { return redisHarnessWith(t, false) }

func redisHarnessWith(t *testing.T, noPipeline bool) storeHarness {
	srv := startRedis(t)
	s := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}, DisablePipeline: noPipeline})
	c := srv.Client(t)
	return storeHarness{
		store:  s,
		elapse: time.Sleep,
		value:  func(key string) string { return c.Get(context.Background(), key).Val() },
		ttl:    func(key string) time.Duration { return c.PTTL(context.Background(), key).Val() },
		short:  150 * time.Millisecond,
	}
}

func TestStoreContractMemory(t *testing.T) { runStoreContract(t, memoryHarness) }
func TestStoreContractRedis(t *testing.T)  { runStoreContract(t, redisHarness) }

// The same contract with pipelining off (disable_pipeline).
func TestStoreContractRedisNoPipeline(t *testing.T) {
	runStoreContract(t, func(t *testing.T) storeHarness { return redisHarnessWith(t, true) })
}

func runStoreContract(t *testing.T, newHarness func(*testing.T) storeHarness) {
	ctx := context.Background()
	const lockTTL, retention = 30 * time.Second, 72 * time.Hour
	rec := DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "payment_intent.succeeded"}

	approx := func(t *testing.T, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-2*time.Second {
			t.Fatalf("ttl = %v, want about %v", got, want)
		}
	}
	mustClaim := func(t *testing.T, h storeHarness, key, token string, ttl time.Duration, want ClaimResult) {
		t.Helper()
		got, _, err := h.store.Claim(ctx, key, token, ttl)
		if err != nil {
			t.Fatalf("claim %s: %v", key, err)
		}
		if got != want {
			t.Fatalf("claim %s with %s = %v, want %v", key, token, got, want)
		}
	}

	t.Run("claim creates an in-flight lease with lock_ttl", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if v := h.value("k"); v != "inflight:tok1" {
			t.Fatalf("value = %q", v)
		}
		approx(t, h.ttl("k"), lockTTL)
	})
	t.Run("second claim sees in flight and changes nothing", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		mustClaim(t, h, "k", "tok2", time.Hour, InFlight)
		if v := h.value("k"); v != "inflight:tok1" {
			t.Fatalf("value = %q", v)
		}
		approx(t, h.ttl("k"), lockTTL)
	})
	t.Run("a retried claim with the same token is ours", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
	})
	t.Run("renew checks the token and extends", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", 5*time.Second, Claimed)
		if ok, err := h.store.Renew(ctx, "k", "other", time.Minute); err != nil || ok {
			t.Fatalf("renew with a foreign token = %v, %v; want false", ok, err)
		}
		approx(t, h.ttl("k"), 5*time.Second)
		if ok, err := h.store.Renew(ctx, "k", "tok1", time.Minute); err != nil || !ok {
			t.Fatalf("renew = %v, %v; want true", ok, err)
		}
		approx(t, h.ttl("k"), time.Minute)
		if ok, _ := h.store.Renew(ctx, "absent", "tok1", time.Minute); ok {
			t.Fatal("renew of an absent key succeeded")
		}
		if v := h.value("absent"); v != "" {
			t.Fatalf("renew created a key: %q", v)
		}
	})
	t.Run("commit writes the done record with retention", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		held, err := h.store.Commit(ctx, "k", "tok1", rec, retention)
		if err != nil || !held {
			t.Fatalf("commit = %v, %v; want held", held, err)
		}
		want := `done:{"processed_at":"2024-12-02T12:00:01Z","event_type":"payment_intent.succeeded"}`
		if v := h.value("k"); v != want {
			t.Fatalf("value = %q, want %q", v, want)
		}
		approx(t, h.ttl("k"), retention)
		mustClaim(t, h, "k", "tok2", lockTTL, AlreadyDone)
		mustClaim(t, h, "k", "tok1", lockTTL, AlreadyDone)
	})
	t.Run("commit after the lease was lost records done and says so", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		held, err := h.store.Commit(ctx, "k", "tok2", rec, retention)
		if err != nil || held {
			t.Fatalf("commit with a foreign token = %v, %v; want not held", held, err)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, AlreadyDone)
		// and a commit on a key that expired meanwhile
		held, err = h.store.Commit(ctx, "gone", "tok1", rec, retention)
		if err != nil || held {
			t.Fatalf("commit of an absent key = %v, %v; want not held", held, err)
		}
		mustClaim(t, h, "gone", "tok3", lockTTL, AlreadyDone)
	})
	t.Run("release checks the token and deletes", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if ok, err := h.store.Release(ctx, "k", "tok2"); err != nil || ok {
			t.Fatalf("release with a foreign token = %v, %v; want false", ok, err)
		}
		if v := h.value("k"); v != "inflight:tok1" {
			t.Fatalf("foreign release changed the key: %q", v)
		}
		if ok, err := h.store.Release(ctx, "k", "tok1"); err != nil || !ok {
			t.Fatalf("release = %v, %v; want true", ok, err)
		}
		if v := h.value("k"); v != "" {
			t.Fatalf("key still there after release: %q", v)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, Claimed)
	})
	t.Run("release never deletes a done record", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if _, err := h.store.Commit(ctx, "k", "tok1", rec, retention); err != nil {
			t.Fatal(err)
		}
		if ok, err := h.store.Release(ctx, "k", "tok1"); err != nil || ok {
			t.Fatalf("release after commit = %v, %v; want false", ok, err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, AlreadyDone)
	})
	t.Run("an expired lease can be claimed again and not renewed", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", h.short, Claimed)
		h.elapse(h.short + h.short/2)
		if ok, _ := h.store.Renew(ctx, "k", "tok1", lockTTL); ok {
			t.Fatal("renewed an expired lease")
		}
		mustClaim(t, h, "k", "tok2", lockTTL, Claimed)
		if ok, _ := h.store.Release(ctx, "k", "tok1"); ok {
			t.Fatal("the first owner released the second owner's lease")
		}
	})
	t.Run("a done record expires after retention", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if _, err := h.store.Commit(ctx, "k", "tok1", rec, h.short); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, AlreadyDone)
		h.elapse(h.short + h.short/2)
		mustClaim(t, h, "k", "tok2", lockTTL, Claimed)
	})
	t.Run("concurrent claims: exactly one wins", func(t *testing.T) {
		h := newHarness(t)
		var claimed, inflight atomic.Int32
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, _, err := h.store.Claim(ctx, "race", "tok"+strings.Repeat("x", i), lockTTL)
				if err != nil {
					t.Error(err)
					return
				}
				switch res {
				case Claimed:
					claimed.Add(1)
				case InFlight:
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
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if res, found, err := h.store.Claim(ctx, "k", "tok2", lockTTL); err != nil || res != InFlight || found != "inflight:tok1" {
			t.Fatalf("claim of a leased key = %v, %q, %v; want in flight, the lease", res, found, err)
		}
		fp := DoneRecord{ProcessedAt: rec.ProcessedAt, EventType: rec.EventType, Fingerprint: "00112233445566778899aabbccddeeff"}
		if _, err := h.store.Commit(ctx, "k", "tok1", fp, retention); err != nil {
			t.Fatal(err)
		}
		res, found, err := h.store.Claim(ctx, "k", "tok2", lockTTL)
		if err != nil || res != AlreadyDone || found != fp.encode() {
			t.Fatalf("claim of a done key = %v, %q, %v; want done, %q", res, found, err, fp.encode())
		}
		if got := recordFingerprint(found); got != fp.Fingerprint {
			t.Fatalf("fingerprint read back = %q", got)
		}
	})
	t.Run("get tells absent, in flight and done, with the expiry", func(t *testing.T) {
		h := newHarness(t)
		if e, err := h.store.Get(ctx, "k"); err != nil || e.State() != "absent" {
			t.Fatalf("get of an absent key = %+v, %v", e, err)
		}
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		e, err := h.store.Get(ctx, "k")
		if err != nil || e.State() != "in_flight" || e.Value != "inflight:tok1" || e.ExpiresAt.IsZero() {
			t.Fatalf("get of a leased key = %+v, %v", e, err)
		}
		leaseExpiry := e.ExpiresAt
		if _, err := h.store.Commit(ctx, "k", "tok1", rec, retention); err != nil {
			t.Fatal(err)
		}
		e, err = h.store.Get(ctx, "k")
		if err != nil || e.State() != "done" || e.Value != rec.encode() {
			t.Fatalf("get of a done key = %+v, %v", e, err)
		}
		// both expiries count from the store's clock
		if d := e.ExpiresAt.Sub(leaseExpiry) - (retention - lockTTL); d > 2*time.Second || d < -2*time.Second {
			t.Fatalf("done record expires %v after the lease would have, want about %v", e.ExpiresAt.Sub(leaseExpiry), retention-lockTTL)
		}
		if h.value("k") != rec.encode() {
			t.Fatal("get changed the key")
		}
	})
	t.Run("forget deletes a done record, a lease only with force", func(t *testing.T) {
		h := newHarness(t)
		if e, deleted, err := h.store.Forget(ctx, "absent", false); err != nil || deleted || e.Value != "" {
			t.Fatalf("forget of an absent key = %+v, %v, %v", e, deleted, err)
		}
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		if e, deleted, err := h.store.Forget(ctx, "k", false); err != nil || deleted || e.State() != "in_flight" {
			t.Fatalf("forget of a leased key without force = %+v, %v, %v; want in flight, kept", e, deleted, err)
		}
		if h.value("k") != "inflight:tok1" {
			t.Fatal("forget without force removed a lease")
		}
		if e, deleted, err := h.store.Forget(ctx, "k", true); err != nil || !deleted || e.State() != "in_flight" {
			t.Fatalf("forced forget of a leased key = %+v, %v, %v; want deleted", e, deleted, err)
		}
		mustClaim(t, h, "k", "tok2", lockTTL, Claimed)
		if _, err := h.store.Commit(ctx, "k", "tok2", rec, retention); err != nil {
			t.Fatal(err)
		}
		e, deleted, err := h.store.Forget(ctx, "k", false)
		if err != nil || !deleted || e.Value != rec.encode() {
			t.Fatalf("forget of a done key = %+v, %v, %v; want the record, deleted", e, deleted, err)
		}
		if v := h.value("k"); v != "" {
			t.Fatalf("key still there after forget: %q", v)
		}
		mustClaim(t, h, "k", "tok3", lockTTL, Claimed)
	})
	// A store used directly (not through a handler's Validate) may be
	// given the longest Duration: its expiry saturates, never wraps into
	// the past. (Found by review: the file store wrote expiries past 2262
	// as negative Unix nanoseconds, so every record was already expired.)
	t.Run("the longest ttl never wraps into the past", func(t *testing.T) {
		h := newHarness(t)
		const forever = time.Duration(math.MaxInt64)
		mustClaim(t, h, "k", "tok1", forever, Claimed)
		mustClaim(t, h, "k", "tok2", lockTTL, InFlight)
		if held, err := h.store.Commit(ctx, "k", "tok1", rec, forever); err != nil || !held {
			t.Fatalf("commit = %v, %v; want held", held, err)
		}
		for i := range 3 {
			mustClaim(t, h, "k", "tok"+strconv.Itoa(3+i), lockTTL, AlreadyDone)
		}
		e, err := h.store.Get(ctx, "k")
		if err != nil || e.State() != "done" || !e.ExpiresAt.After(time.Now().AddDate(200, 0, 0)) {
			t.Fatalf("get = %+v, %v; want done, expiring centuries from now", e, err)
		}
	})
	t.Run("event types are stored as JSON strings", func(t *testing.T) {
		h := newHarness(t)
		mustClaim(t, h, "k", "tok1", lockTTL, Claimed)
		odd := DoneRecord{ProcessedAt: rec.ProcessedAt, EventType: "a\"b\\c\n"}
		if _, err := h.store.Commit(ctx, "k", "tok1", odd, retention); err != nil {
			t.Fatal(err)
		}
		want := `done:{"processed_at":"2024-12-02T12:00:01Z","event_type":"a\"b\\c\u000a"}`
		if v := h.value("k"); v != want {
			t.Fatalf("value = %q, want %q", v, want)
		}
	})
}

func TestRedisStoreErrorIsNotDuplicate(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}, DialTimeout: caddy.Duration(200 * time.Millisecond)})
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "k", "tok1", time.Minute); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	res, _, err := s.Claim(ctx, "k", "tok2", time.Minute)
	if err == nil {
		t.Fatalf("claim with Redis down = %v, nil error; want an error", res)
	}
	if _, err := s.Commit(ctx, "k", "tok1", DoneRecord{}, time.Minute); err == nil {
		t.Fatal("commit with Redis down: want an error")
	}
	if _, err := s.Release(ctx, "k", "tok1"); err == nil {
		t.Fatal("release with Redis down: want an error")
	}
	if _, err := s.Renew(ctx, "k", "tok1", time.Minute); err == nil {
		t.Fatal("renew with Redis down: want an error")
	}
	// Back again on the same port: the same client works, scripts are
	// reloaded (NOSCRIPT after a restart is handled).
	srv.Restart(t)
	if res, _, err := s.Claim(ctx, "k2", "tok1", time.Minute); err != nil || res != Claimed {
		t.Fatalf("claim after restart = %v, %v", res, err)
	}
	if ok, err := s.Release(ctx, "k2", "tok1"); err != nil || !ok {
		t.Fatalf("release after restart = %v, %v", ok, err)
	}
}

func TestMemorySweeper(t *testing.T) {
	clock := newFakeClock()
	st := newMemState(clock.Now, time.Hour)
	defer st.Destruct()
	st.claim("a", "t", time.Second)
	st.claim("b", "t", time.Hour)
	st.commit("c", "t", "done:{}", 2*time.Second)
	if n := memEntries(st); n != 3 {
		t.Fatalf("size = %d", n)
	}
	clock.Advance(3 * time.Second)
	if n := st.sweep(); n != 2 {
		t.Fatalf("swept %d, want 2", n)
	}
	if n := memEntries(st); n != 1 {
		t.Fatalf("size after sweep = %d, want 1", n)
	}
}

func TestMemorySweeperRunsAndStops(t *testing.T) {
	st := newMemState(time.Now, 10*time.Millisecond)
	st.claim("a", "t", time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for memEntries(st) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired entry within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st.Destruct() // returns only once the sweeper goroutine has exited
	select {
	case <-st.done:
	default:
		t.Fatal("sweeper still running after Destruct")
	}
}

func TestMemoryStateSharedAcrossReloads(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := new(MemoryStore)
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, "reload-k", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	b := new(MemoryStore) // the new config is provisioned before the old one is cleaned up
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	a.Cleanup()
	if res, _, _ := b.Claim(ctx, "reload-k", "tok2", time.Minute); res != InFlight {
		t.Fatalf("after reload the claim was forgotten: %v", res)
	}
	b.Cleanup()
	c := new(MemoryStore) // every user gone: a fresh state
	if err := c.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Cleanup()
	if res, _, _ := c.Claim(ctx, "reload-k", "tok3", time.Minute); res != Claimed {
		t.Fatalf("state outlived its last user: %v", res)
	}
}

// TestRedisWaitReplicas: with wait_replicas the done record is on the
// replica when Commit returns; when fewer replicas acknowledge it, the
// record stays on the master and the shortfall is counted.
func TestRedisWaitReplicas(t *testing.T) {
	master := startRedis(t)
	replica := redistest.StartReplica(t, master)
	rc := replica.Client(t)
	ctx := context.Background()
	rec := DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "x"}

	s := provisionRedisStore(t, &RedisStore{Address: []string{master.Addr}, WaitReplicas: 1, WaitTimeout: caddy.Duration(2 * time.Second)})
	before := testutil.ToFloat64(metrics.unreplicated)
	for i := range 20 {
		key := "wait:" + strconv.Itoa(i)
		if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
			t.Fatal(err)
		}
		if held, err := s.Commit(ctx, key, "tok", rec, time.Hour); err != nil || !held {
			t.Fatalf("commit: %v %v", held, err)
		}
		if v := rc.Get(ctx, key).Val(); !strings.HasPrefix(v, donePrefix) {
			t.Fatalf("right after a WAIT 1 commit the replica holds %q", v)
		}
	}
	if d := testutil.ToFloat64(metrics.unreplicated) - before; d != 0 {
		t.Fatalf("unreplicated moved by %v with the replica up", d)
	}

	s2 := provisionRedisStore(t, &RedisStore{Address: []string{master.Addr}, WaitReplicas: 2, WaitTimeout: caddy.Duration(50 * time.Millisecond)})
	if _, _, err := s2.Claim(ctx, "wait:short", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if held, err := s2.Commit(ctx, "wait:short", "tok", rec, time.Hour); err != nil || !held {
		t.Fatalf("commit with too few replicas: %v %v (the record must still be written)", held, err)
	}
	if d := testutil.ToFloat64(metrics.unreplicated) - before; d != 1 {
		t.Fatalf("unreplicated moved by %v, want 1", d)
	}
	if res, _, _ := s2.Claim(ctx, "wait:short", "tok2", time.Minute); res != AlreadyDone {
		t.Fatalf("claim after the commit: %v", res)
	}
}

func TestRedisStoreValidate(t *testing.T) {
	for name, c := range map[string]struct {
		s  RedisStore
		ok bool
	}{
		"defaults":                         {RedisStore{}, true},
		"wait under the read timeout":      {RedisStore{WaitReplicas: 1, WaitTimeout: caddy.Duration(time.Second)}, true},
		"wait past the default read":       {RedisStore{WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second)}, false},
		"wait under a longer read timeout": {RedisStore{WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second), ReadTimeout: caddy.Duration(10 * time.Second)}, true},
		"negative db":                      {RedisStore{DB: -1}, false},
		"negative wait_replicas":           {RedisStore{WaitReplicas: -1}, false},
		"negative timeout":                 {RedisStore{DialTimeout: -1}, false},
	} {
		if err := c.s.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", name, err, c.ok)
		}
	}
}

// pooledStore is a store whose shared resource (a Redis client, an open
// file) deliveries may still need after their config is cleaned up.
type pooledStore interface {
	Store
	caddy.Provisioner
	caddy.CleanerUpper
	storeUser
}

// TestCleanupWaitsForDeliveries: on a reload Caddy cleans the old config
// up while its requests are still in flight; the old store's client or
// file must stay open until they are settled (their commits land), then
// be closed.
func TestCleanupWaitsForDeliveries(t *testing.T) {
	for name, newStore := range map[string]func(t *testing.T) pooledStore{
		"redis": func(t *testing.T) pooledStore {
			return &RedisStore{Address: []string{startRedis(t).Addr}, PoolSize: 3} // a pool key of its own
		},
		"file": func(t *testing.T) pooledStore {
			return &FileStore{Path: filepath.Join(t.TempDir(), "dedup.db")}
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			s := newStore(t)
			if err := s.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			s.enter() // a delivery in flight
			if res, _, err := s.Claim(ctx, "drain-k", "tok", time.Minute); err != nil || res != Claimed {
				t.Fatalf("claim: %v, %v", res, err)
			}
			if err := s.Cleanup(); err != nil { // the reload
				t.Fatal(err)
			}
			if held, err := s.Commit(ctx, "drain-k", "tok", DoneRecord{ProcessedAt: time.Now()}, time.Hour); err != nil || !held {
				t.Fatalf("commit of a delivery in flight after its config was cleaned up: held %v, %v", held, err)
			}
			s.leave()
			deadline := time.Now().Add(10 * time.Second)
			for {
				if _, _, err := s.Claim(ctx, "drain-k2", "tok", time.Minute); err != nil {
					break // closed once its last delivery was done
				}
				if time.Now().After(deadline) {
					t.Fatal("the store of a cleaned-up config is still open 10 s after its last delivery")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// memEntries counts the entries of a memory state, expired or not.
func memEntries(s *memState) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

func TestRedisStoreProvisionErrorsHideThePassword(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, s := range []*RedisStore{
		{URL: "redis://user:hunter2secret@host:6379/x"},
		{URL: "redis://user:hunter2secret@ho st:6379"},
		{URL: "http://user:hunter2secret@host"},
		{URL: "redis://user:hunter2secret@host", Address: []string{"a:1"}},
	} {
		err := s.Provision(ctx)
		if err == nil {
			t.Errorf("%q provisioned", s.URL)
			continue
		}
		if strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}
