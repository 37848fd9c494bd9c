package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
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

// A delivery that took over a mark (marked) and whose signature binding
// then fails (a replay under its ID, or a store error) keeps its lease
// until lock_ttl, as settle does for a non-2xx answer: released, the
// next delivery would go on unmarked though the earlier attempt's fate
// is still unknown. (Found by review of the hold of marked deliveries.)
func TestSignatureBindingFailureKeepsTheMark(t *testing.T) {
	dir := t.TempDir()
	h, logs := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = json.RawMessage(`{"type":"file","path":"` + filepath.Join(dir, "dedup.db") + `"}`)
	})
	ctx := context.Background()
	const key, sigKey = "sangho_dedup:evt_x", "sangho_dedup:sig:replayed"
	if res, _, err := h.store.Claim(ctx, key, "first", 50*time.Millisecond); err != nil || res != dedup.Claimed {
		t.Fatalf("first attempt's claim = %v, %v", res, err)
	}
	time.Sleep(120 * time.Millisecond) // its lease runs out unsettled: a mark
	res, _, err := h.store.Claim(ctx, key, "second", 100*time.Millisecond)
	if err != nil || res != dedup.Reclaimed {
		t.Fatalf("second attempt's claim = %v, %v; want Reclaimed", res, err)
	}
	if res, _, err := h.store.Claim(ctx, sigKey, "evt_other", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("the message bound to another ID: %v, %v", res, err)
	}
	h.sigMemory = time.Minute
	d := &delivery{h: h, ctx: ctx, sigKey: sigKey, id: "evt_x", key: key, token: "second", marked: true}
	if err := d.bindSignature(); !errors.Is(err, errSigReplayed) {
		t.Fatalf("bind = %v; want the replay refused", err)
	}
	if e, err := h.store.Get(ctx, key); err != nil || e.State() != "in_flight" {
		t.Fatalf("after the refusal: %q %v; want the lease kept", e.State(), err)
	}
	if logs.FilterMessage("event held").Len() != 1 {
		t.Errorf("no \"event held\" line for the kept lease")
	}
	time.Sleep(150 * time.Millisecond)
	if res, _, err := h.store.Claim(ctx, key, "third", time.Minute); err != nil || res != dedup.Reclaimed {
		t.Fatalf("the next attempt: %v, %v; want Reclaimed (marked)", res, err)
	}
}
