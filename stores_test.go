package sanghodedup

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
	redisstore "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

// pooledStore is a store whose shared resource (a Redis client, an open
// file) deliveries may still need after their config is cleaned up.
type pooledStore interface {
	dedup.Store
	caddy.Provisioner
	caddy.CleanerUpper
	dedup.UseCounter
}

// TestCleanupWaitsForDeliveries: on a reload Caddy cleans the old config
// up while its requests are still in flight; the old store's client or
// file must stay open until they are settled (their commits land), then
// be closed.
func TestCleanupWaitsForDeliveries(t *testing.T) {
	for name, newStore := range map[string]func(t *testing.T) pooledStore{
		"redis": func(t *testing.T) pooledStore {
			return &redisstore.Store{Address: []string{startRedis(t).Addr}, PoolSize: 3} // a pool key of its own
		},
		"file": func(t *testing.T) pooledStore {
			return &filestore.Store{Path: filepath.Join(t.TempDir(), "dedup.db")}
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			s := newStore(t)
			if err := s.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			s.Enter() // a delivery in flight
			if res, _, err := s.Claim(ctx, "drain-k", "tok", time.Minute); err != nil || res != dedup.Claimed {
				t.Fatalf("claim: %v, %v", res, err)
			}
			if err := s.Cleanup(); err != nil { // the reload
				t.Fatal(err)
			}
			if held, err := s.Commit(ctx, "drain-k", "tok", dedup.DoneRecord{ProcessedAt: time.Now()}, time.Hour); err != nil || !held {
				t.Fatalf("commit of a delivery in flight after its config was cleaned up: held %v, %v", held, err)
			}
			s.Leave()
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
