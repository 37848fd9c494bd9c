package sanghodedup

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// TestLeaseRenewal: a backend slower than lock_ttl keeps its lease, and
// a duplicate meanwhile gets 409.
func TestLeaseRenewal(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(300 * time.Millisecond) })
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		serve(h, signedRequest(bodyA, ""), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			close(entered)
			<-release
			return nil
		}))
		close(done)
	}()
	<-entered
	next := &countingNext{}
	for i := 0; i < 6; i++ { // 6 × 200ms: four times lock_ttl
		time.Sleep(200 * time.Millisecond)
		if w, _, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 409 {
			t.Fatalf("after %dms in flight: %d, want 409", (i+1)*200, w.Code)
		}
	}
	close(release)
	<-done
	if next.calls.Load() != 0 {
		t.Fatal("a duplicate reached the backend while the first was in flight")
	}
}

// TestLeaseLost: another delivery takes the lease over while the backend
// works (here: an operator forgets the lease, another claims it). The
// next renewal finds it lost, then the commit: each is logged ("lease
// lost", during renewal, then commit) and counted, and the event is
// recorded as done all the same, since the backend did process it.
func TestLeaseLost(t *testing.T) {
	h, logs := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(300 * time.Millisecond)
		h.KeyPrefix = "lease_lost:"
	})
	key := h.KeyPrefix + "evt_1QZtest000000000001"
	lost := func(during string) int {
		return logs.FilterMessage("lease lost").FilterField(zap.String("during", during)).Len()
	}
	before := testutil.ToFloat64(metrics.leaseLost)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		ctx := context.Background()
		if _, _, err := h.store.Forget(ctx, key, true); err != nil {
			t.Error(err)
		}
		if res, _, err := h.store.Claim(ctx, key, "another", time.Minute); err != nil || res != dedup.Claimed {
			t.Errorf("taking the lease over: %v %v", res, err)
		}
		for deadline := time.Now().Add(10 * time.Second); lost("renewal") == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("no renewal found the lease lost within 10 s")
				break
			}
		}
		w.WriteHeader(200)
		return nil
	})
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%d %q", w.Code, outcomeOf(repl))
	}
	if lost("renewal") != 1 || lost("commit") != 1 {
		t.Errorf(`"lease lost" lines: %d during renewal, %d during commit; want 1 and 1`, lost("renewal"), lost("commit"))
	}
	if d := testutil.ToFloat64(metrics.leaseLost) - before; d != 2 {
		t.Errorf("caddy_sangho_dedup_lease_lost_total moved by %v, want 2", d)
	}
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); outcomeOf(repl) != outcomeDuplicate {
		t.Errorf("after the lost lease's commit: %q, want duplicate", outcomeOf(repl))
	}
}
