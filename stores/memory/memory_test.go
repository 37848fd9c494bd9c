package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup/dedupstoretest"
	"github.com/sangho/caddy-sangho-dedup/internal/memstate"
	"github.com/sangho/caddy-sangho-dedup/internal/testclock"
)

func harness(t *testing.T) dedupstoretest.Harness {
	clock := testclock.New()
	st := memstate.New(clock.Now, time.Hour)
	t.Cleanup(func() { st.Destruct() })
	m := &Store{state: st}
	return dedupstoretest.Harness{
		Store:  m,
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
