package sanghodedup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// TestSignatureFailureReasons: every refusal the verifiers return has a
// reason of its own in caddy_sangho_dedup_signature_failures_total, not
// "other", wrapped or not.
func TestSignatureFailureReasons(t *testing.T) {
	for err, want := range map[error]string{
		errSigMissing: "missing", errSigMalformed: "malformed", errSigPrefix: "malformed",
		errSigEncoding: "malformed", errSigCount: "malformed", errSWTooMany: "malformed",
		errSigTimestamp: "timestamp", errSigMismatch: "mismatch", errSigReplayed: "replayed",
		fmt.Errorf("%w: Sangho-Signature", errSigMissing): "missing",
		errors.New("something else"):                      "other",
	} {
		if got := sigFailureReason(err); got != want {
			t.Errorf("%v: reason %q, want %q", err, got, want)
		}
		if metrics.sigReason[want] == nil {
			t.Errorf("reason %q has no counter", want)
		}
	}
}

// TestEventsInFlightGauge: caddy_sangho_dedup_events_in_flight counts a
// delivery while the backend works on it, and not after.
func TestEventsInFlightGauge(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "inflight:" })
	before := testutil.ToFloat64(metrics.inFlight)
	var during float64
	next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		during = testutil.ToFloat64(metrics.inFlight)
		w.WriteHeader(http.StatusOK)
		return nil
	}}
	serve(h, signedRequest(eventBody("evt_inflight"), ""), next)
	if during-before != 1 {
		t.Errorf("while the backend worked: %v, want %v", during, before+1)
	}
	if after := testutil.ToFloat64(metrics.inFlight); after != before {
		t.Errorf("after: %v, want %v", after, before)
	}
}

// TestLocalCacheOffGauge: caddy_sangho_dedup_local_cache_off counts a
// Redis store whose cache is refused (no CLIENT TRACKING) or whose
// Redis is gone, and not one whose cache serves, nor one closed.
func TestLocalCacheOffGauge(t *testing.T) {
	base := testutil.ToFloat64(metrics.cacheOff)
	gauge := func() float64 { return testutil.ToFloat64(metrics.cacheOff) - base }

	srv := startRedis(t)
	s := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}, PoolSize: 7, LocalCache: intPtr(10000)})
	waitFor(t, "tracking connection", s.cache.live.Load)
	if g := gauge(); g != 0 {
		t.Fatalf("cache serving: gauge moved by %v", g)
	}

	pw := aclUser(t, srv.Client(t), "notrack", "", "+client|tracking")
	refused := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}, Username: "notrack", Password: pw, LocalCache: intPtr(10000)})
	time.Sleep(300 * time.Millisecond) // its first tracking attempt is refused
	if g := gauge(); g != 1 || refused.cache.live.Load() {
		t.Fatalf("without CLIENT TRACKING: gauge moved by %v, want 1", g)
	}
	refused.Cleanup()
	waitFor(t, "the refused store closed", func() bool { return gauge() == 0 })

	srv.Kill()
	waitFor(t, "the cache off with Redis gone", func() bool { return gauge() == 1 })
	s.Cleanup()
	waitFor(t, "the store closed", func() bool { return gauge() == 0 })
}

// TestRedisProblemsCounted: each warning of the Redis store's checks
// moves its own series of caddy_sangho_dedup_redis_problems_total.
func TestRedisProblemsCounted(t *testing.T) {
	ctx := context.Background()
	count := func(p string) float64 { return testutil.ToFloat64(metrics.redisProblems.WithLabelValues(p)) }

	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	evict0, perm0 := count(redisMayEvict), count(redisPermissionMissing)
	s := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}})
	if _, _, err := s.Claim(ctx, DefaultKeyPrefix+"evt_problems", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := count(redisMayEvict) - evict0; d != 1 {
		t.Errorf("may_evict moved by %v, want 1", d)
	}

	pw := aclUser(t, srv.Client(t), "nopexpire", "", "+pexpire")
	u := provisionRedisStore(t, &RedisStore{Address: []string{srv.Addr}, Username: "nopexpire", Password: pw})
	observeStore(u)
	if _, _, err := u.Claim(ctx, DefaultKeyPrefix+"evt_problems2", "tok", time.Minute); err == nil {
		t.Fatal("claim without PEXPIRE succeeded")
	}
	if d := count(redisPermissionMissing) - perm0; d != 1 {
		t.Errorf("permission_missing moved by %v, want 1", d)
	}

	full := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-random")
	admin := full.Client(t)
	big := strings.Repeat("x", 64<<10)
	for i := 0; i < 200 && infoField(admin.Info(ctx, "stats").Val(), "evicted_keys") <= 0; i++ {
		if err := admin.Set(ctx, fmt.Sprintf("filler:%d", i), big, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	evicted0 := count(redisEvictedKeys)
	f := provisionRedisStore(t, &RedisStore{Address: []string{full.Addr}})
	observeStore(f)
	if _, _, err := f.Claim(ctx, DefaultKeyPrefix+"evt_problems3", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := count(redisEvictedKeys) - evicted0; d != 1 {
		t.Errorf("evicted_keys moved by %v, want 1", d)
	}
}
