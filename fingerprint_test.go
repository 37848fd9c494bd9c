package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// The two fingerprint formats, computed here independently of the
// handler: what older versions stored (the first 16 bytes of the
// body's SHA-256 in hex, 32 characters) and what this one stores ("x"
// and the body's xxh64 in hex, 17 characters).
func wantSHA256Fingerprint(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:16])
}

func wantXXH64Fingerprint(body string) string {
	return "x" + hex.EncodeToString(binary.BigEndian.AppendUint64(nil, xxhash.Sum64String(body)))
}

// TestFingerprintFormats: a record or a lease written with either
// fingerprint format answers every body as the format it was written
// in says: the same body is a duplicate (or in flight, without a
// warning), another body is a payload mismatch (422, or in flight with
// a warning). Records written before this version (SHA-256) compare as
// they did; a format this version does not know compares as no
// fingerprint (a duplicate), as records older than fingerprints do.
func TestFingerprintFormats(t *testing.T) {
	const id = "evt_fmt"
	same := `{"id":"evt_fmt","type":"charge.succeeded","data":{"amount":1}}`
	other := `{"id":"evt_fmt","type":"charge.succeeded","data":{"amount":2}}`
	formats := map[string]string{
		"sha256 (older versions)": wantSHA256Fingerprint(same),
		"xxh64":                   wantXXH64Fingerprint(same),
	}
	ctx := context.Background()
	for name, fp := range formats {
		t.Run(name+"/done", func(t *testing.T) {
			for _, c := range []struct {
				body string
				code int
				hdr  string
			}{{same, 200, "duplicate"}, {other, http.StatusUnprocessableEntity, "payload_mismatch"}} {
				h, _ := newTestHandler(t, nil)
				rec := dedup.DoneRecord{ProcessedAt: testNow, EventType: "charge.succeeded", Fingerprint: fp}
				if _, err := h.store.Commit(ctx, h.KeyPrefix+id, "t", rec, time.Hour); err != nil {
					t.Fatal(err)
				}
				next := &countingNext{}
				w, _, _ := serve(h, signedRequest(c.body, ""), next)
				if w.Code != c.code || w.Header().Get("Sangho-Dedup") != c.hdr || next.calls.Load() != 0 {
					t.Errorf("body %s: %d %q, backend %d; want %d %q, no backend",
						c.body, w.Code, w.Header().Get("Sangho-Dedup"), next.calls.Load(), c.code, c.hdr)
				}
			}
		})
		t.Run(name+"/lease", func(t *testing.T) {
			for _, c := range []struct {
				body     string
				warnings int
			}{{same, 0}, {other, 1}} {
				h, logs := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "lease_" + fp + c.body[len(c.body)-3:len(c.body)-2] + ":" })
				if res, _, err := h.store.Claim(ctx, h.KeyPrefix+id, newToken()+"."+fp, time.Hour); err != nil || res != dedup.Claimed {
					t.Fatal(res, err)
				}
				w, _, _ := serve(h, signedRequest(c.body, ""), &countingNext{})
				if w.Code != http.StatusConflict {
					t.Errorf("body %s: %d, want 409", c.body, w.Code)
				}
				if n := logs.FilterMessage("payload mismatch").FilterField(zap.String("state", "in_flight")).Len(); n != c.warnings {
					t.Errorf("body %s: %d payload mismatch warnings, want %d", c.body, n, c.warnings)
				}
			}
		})
	}
	t.Run("unknown format: compared as none", func(t *testing.T) {
		h, _ := newTestHandler(t, nil)
		rec := dedup.DoneRecord{ProcessedAt: testNow, Fingerprint: "z0123"}
		if _, err := h.store.Commit(ctx, h.KeyPrefix+id, "t", rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		if w, _, _ := serve(h, signedRequest(other, ""), &countingNext{}); w.Code != 200 || w.Header().Get("Sangho-Dedup") != "duplicate" {
			t.Errorf("%d %q, want 200 duplicate", w.Code, w.Header().Get("Sangho-Dedup"))
		}
	})
	t.Run("new records and leases carry xxh64", func(t *testing.T) {
		h, _ := newTestHandler(t, nil)
		var token string
		next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
			e, err := h.store.Get(ctx, h.KeyPrefix+id)
			if err != nil {
				return err
			}
			token = e.Value
			w.WriteHeader(200)
			return nil
		}}
		if w, _, _ := serve(h, signedRequest(same, ""), next); w.Code != 200 {
			t.Fatalf("first delivery: %d", w.Code)
		}
		if got := dedup.Fingerprint(token); got != wantXXH64Fingerprint(same) {
			t.Errorf("lease %q: fingerprint %q, want %q", token, got, wantXXH64Fingerprint(same))
		}
		e, err := h.store.Get(ctx, h.KeyPrefix+id)
		if err != nil {
			t.Fatal(err)
		}
		if rec, _ := dedup.DecodeDone(e.Value); rec.Fingerprint != wantXXH64Fingerprint(same) {
			t.Errorf("record %q: fingerprint %q, want %q", e.Value, rec.Fingerprint, wantXXH64Fingerprint(same))
		}
	})
}
