package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestLocalCacheOffGauge: caddy_sangho_dedup_local_cache_off counts a
// Redis store whose cache is refused (no CLIENT TRACKING) or whose
// Redis is gone, and not one whose cache serves, nor one closed.
func TestLocalCacheOffGauge(t *testing.T) {
	base := testutil.ToFloat64(metrics.cacheOff)
	gauge := func() float64 { return testutil.ToFloat64(metrics.cacheOff) - base }

	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, PoolSize: 7, LocalCache: intPtr(10000)})
	waitFor(t, "tracking connection", s.cache.Live)
	if g := gauge(); g != 0 {
		t.Fatalf("cache serving: gauge moved by %v", g)
	}

	pw := redistest.ACLUser(t, srv.Client(t), "notrack", "", "+client|tracking")
	refused := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: "notrack", Password: pw, LocalCache: intPtr(10000)})
	time.Sleep(300 * time.Millisecond) // its first tracking attempt is refused
	if g := gauge(); g != 1 || refused.cache.Live() {
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
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_problems", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := count(redisMayEvict) - evict0; d != 1 {
		t.Errorf("may_evict moved by %v, want 1", d)
	}

	pw := redistest.ACLUser(t, srv.Client(t), "nopexpire", "", "+pexpire")
	u := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: "nopexpire", Password: pw})
	observeStore(u)
	if _, _, err := u.Claim(ctx, testKeyPrefix+"evt_problems2", "tok", time.Minute); err == nil {
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
	f := provisionRedisStore(t, &Store{Address: []string{full.Addr}})
	observeStore(f)
	if _, _, err := f.Claim(ctx, testKeyPrefix+"evt_problems3", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := count(redisEvictedKeys) - evicted0; d != 1 {
		t.Errorf("evicted_keys moved by %v, want 1", d)
	}
}
