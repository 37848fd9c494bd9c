package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestPayloadMismatchOverRedisRecordForms: on Redis, an event whose done
// record is in either form (the JSON one written before compact records,
// by the same SET ... PX, or the compact one the store writes now)
// answers the same body as a duplicate and another body with 422,
// without reaching the backend.
func TestPayloadMismatchOverRedisRecordForms(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	h, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = json.RawMessage(`{"type":"redis","address":["` + srv.Addr + `"],"local_cache":0}`)
	})
	ctx := context.Background()
	for _, form := range []string{"json", "compact"} {
		id := "evt_form_" + form
		body := eventBody(id)
		sum := sha256.Sum256([]byte(body))
		rec := dedup.DoneRecord{ProcessedAt: testNow, EventType: "charge.succeeded", Fingerprint: hex.EncodeToString(sum[:16])}
		val := rec.Encode()
		if form == "compact" {
			val = rec.EncodeCompact()
		}
		if err := c.Set(ctx, h.KeyPrefix+id, val, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		next := &countingNext{}
		if w, repl, _ := serve(h, signedRequest(body, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeDuplicate {
			t.Errorf("%s record, same body: %d %s, want 200 duplicate", form, w.Code, outcomeOf(repl))
		}
		other := body[:len(body)-1] + " }"
		if w, repl, _ := serve(h, signedRequest(other, ""), next); w.Code != http.StatusUnprocessableEntity || outcomeOf(repl) != outcomePayloadMismatch {
			t.Errorf("%s record, another body: %d %s, want 422 payload_mismatch", form, w.Code, outcomeOf(repl))
		}
		if next.calls.Load() != 0 {
			t.Errorf("%s record: the backend was reached", form)
		}
	}
}
