package sanghodedup

import (
	"context"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// A signed message is bound to the event ID it came with for sigMemory,
// no longer: a binding whose time ran out without a commit (its Caddy
// died, or it was held after a timeout) is kept by the store as a mark
// (dedup.Reclaimed), and must not refuse the message for the mark's
// seven days. (Found by review of issue 26's marks.)
func TestSignatureBindingEndsWithSigMemoryEvenAsAMark(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	ctx := context.Background()
	const sigKey = "sangho_dedup:sig:test"
	if res, _, err := h.store.Claim(ctx, sigKey, "evt_first", 50*time.Millisecond); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	if e, err := h.store.Get(ctx, sigKey); err != nil || e.State() != "in_flight" {
		t.Fatalf("binding = %+v, %v; want in flight", e, err)
	}
	time.Sleep(120 * time.Millisecond)
	if e, err := h.store.Get(ctx, sigKey); err != nil || e.State() != "unknown" {
		t.Fatalf("binding after its time = %+v, %v; want a mark", e, err)
	}
	h.sigMemory = time.Minute
	d := &delivery{h: h, ctx: ctx, sigKey: sigKey, id: "evt_second", key: "sangho_dedup:evt_second", token: "tok"}
	if err := d.bindSignature(); err != nil {
		t.Fatalf("bind over a binding whose time ran out = %v; want bound", err)
	}
}
