package sanghodedup

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestRedisCleanupWaitsForDeliveries: on a reload Caddy cleans the old
// config up while its requests are still in flight; the old store's
// client must stay open until they are settled, then be closed.
func TestRedisCleanupWaitsForDeliveries(t *testing.T) {
	srv := startRedis(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	s := &RedisStore{Address: []string{srv.Addr}, PoolSize: 3} // a pool key of its own
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
			t.Fatal("the client of a cleaned-up config is still open 10 s after its last delivery")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
