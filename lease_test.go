package sanghodedup

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
