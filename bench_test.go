package sanghodedup

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

func BenchmarkExtractEvent(b *testing.B) {
	big := `{"data":{"object":{"items":[` + strings.Repeat(`{"id":"pi_1","note":"a \"quoted\" string"},`, 22000) + `{}]}},"id":"evt_big","type":"x"}`
	long := `{"id":"evt_long","type":"x","data":{"object":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}}`
	nested := nestedBody("evt_nested", 185) // the push of BenchmarkServeBodies
	for name, body := range map[string]string{"small": bodyA, "1MiB-tokens": big, "64KiB-string": long, "64KiB-nested": nested} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			buf := []byte(body)
			for b.Loop() {
				if _, err := extractEvent(buf, nil, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchServe measures ServeHTTP alone: the signed requests are built
// before the timer starts (all new events, or one event again and again).
func benchServe(b *testing.B, configure func(*Handler), duplicates bool) {
	benchServeBody(b, configure, duplicates, eventBody)
}

// benchServeBody is benchServe with the body made by body from the ID.
func benchServeBody(b *testing.B, configure func(*Handler), duplicates bool, eventBody func(id string) string) {
	h, _ := newTestHandler(b, configure)
	h.logger = zap.NewNop() // production logs at info: debug lines cost a level check only
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		w.WriteHeader(200)
		return nil
	})
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	type signed struct{ body, sig string }
	events := make([]signed, b.N)
	for i := range events {
		id := "evt_dup" + prefix
		if !duplicates {
			id = "evt_" + prefix + "_" + strconv.Itoa(i)
		}
		body := eventBody(id)
		events[i] = signed{body, sangho.Sign(testNow, []byte(body), secret1)}
	}
	if duplicates {
		serve(h, signedRequest(events[0].body, ""), next)
	}
	w := httptest.NewRecorder()
	webhookURL, _ := url.Parse("/webhook")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := &http.Request{
			Method: http.MethodPost, URL: webhookURL, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Sangho-Signature": {events[i].sig}},
			Body:          io.NopCloser(strings.NewReader(events[i].body)),
			ContentLength: int64(len(events[i].body)),
		}
		r = r.WithContext(context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer()))
		w.Body.Reset()
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServeHTTP(b *testing.B) {
	memory := func(h *Handler) { h.StoreRaw = []byte(`{"type":"memory"}`) }
	b.Run("memory/new", func(b *testing.B) { benchServe(b, memory, false) })
	b.Run("memory/duplicate", func(b *testing.B) { benchServe(b, memory, true) })
	// A 64 KiB body, most of it one string: what the scanner's
	// word-at-a-time loop is for.
	pad := strings.Repeat("x", 64<<10)
	padded := func(id string) string {
		return `{"id":"` + id + `","type":"x","data":{"object":{"pad":"` + pad + `"}}}`
	}
	b.Run("memory/new-64KiB", func(b *testing.B) { benchServeBody(b, memory, false, padded) })
	if testing.Short() {
		return
	}
	srv := startRedis(b)
	withRedis := func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"]}`)
	}
	b.Run("redis/new", func(b *testing.B) { benchServe(b, withRedis, false) })
	b.Run("redis/duplicate", func(b *testing.B) { benchServe(b, withRedis, true) })
}

// Body shapes of issue 27 item 2, each made from the event ID.
var benchShapes = []struct {
	name string
	body func(id string) string
}{
	// 1 KiB: a typical small event.
	{"1KiB", func(id string) string {
		return `{"id":"` + id + `","type":"x","data":{"object":{"pad":"` + strings.Repeat("x", 1<<10-70) + `"}}}`
	}},
	// 64 KiB, most of it one string: the ID scanner's best case.
	{"64KiB-string", func(id string) string {
		return `{"id":"` + id + `","type":"x","data":{"object":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}}`
	}},
	// 64 KiB of many small nested values, like a GitHub push with 185
	// commits: the scanner's worst case.
	{"64KiB-nested", func(id string) string { return nestedBody(id, 185) }},
}

// nestedBody is an event whose data is a push of n commits, each a
// small object of strings, numbers, booleans and arrays (about 377
// bytes each: 185 of them make 69,854 bytes, 68.2 KiB, with a 10-byte
// ID). The generator is shared with sangho-bench's 64KiB-nested bodies.
func nestedBody(id string, n int) string { return load.NestedBody(id, n) }

// BenchmarkServeBodies measures ServeHTTP per body shape on the memory
// store, for new events and for a duplicate, beside the floor: only
// buffering the body and checking its signature, which any handler in
// front of the backend has to do.
func BenchmarkServeBodies(b *testing.B) {
	memory := func(h *Handler) { h.StoreRaw = []byte(`{"type":"memory"}`) }
	for _, s := range benchShapes {
		b.Run(s.name+"/floor", func(b *testing.B) { benchFloor(b, memory, s.body) })
		b.Run(s.name+"/new", func(b *testing.B) { benchServeBody(b, memory, false, s.body) })
		b.Run(s.name+"/duplicate", func(b *testing.B) { benchServeBody(b, memory, true, s.body) })
	}
}

// benchFloor buffers and verifies each request the way ServeHTTP does,
// and nothing else.
func benchFloor(b *testing.B, configure func(*Handler), eventBody func(id string) string) {
	h, _ := newTestHandler(b, configure)
	body := eventBody("evt_floor")
	sig := sangho.Sign(testNow, []byte(body), secret1)
	webhookURL, _ := url.Parse("/webhook")
	b.ReportAllocs()
	for b.Loop() {
		r := &http.Request{
			Method: http.MethodPost, URL: webhookURL, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Sangho-Signature": {sig}},
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)),
		}
		buf, _, err := h.readBody(r)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.provider.Verify(r, buf.bytes()); err != nil {
			b.Fatal(err)
		}
		r.Body.Close() // what the next handler would hold
		buf.done()
	}
}

// BenchmarkFingerprint: the body's fingerprint as this version computes
// it (xxh64) beside the SHA-256 one of older versions, computed only to
// compare with a record or lease they wrote.
func BenchmarkFingerprint(b *testing.B) {
	for _, s := range benchShapes {
		body := []byte(s.body("evt_fp"))
		b.Run(s.name+"/xxh64", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				fingerprint(body)
			}
		})
		b.Run(s.name+"/sha256", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				sha256Fingerprint(body)
			}
		})
	}
}

// BenchmarkScanner: the ID scanner on each body shape beside the
// scanner as it was before it was made faster (the reference of
// TestScanMatchesReference) and beside what encoding/json offers for
// the same job: json.Valid alone (a lower bound for any design that
// validates with it, before finding the ID) and its tokenizer reading
// the top-level keys (which validates too).
func BenchmarkScanner(b *testing.B) {
	for _, s := range benchShapes {
		body := []byte(s.body("evt_scan"))
		for _, impl := range []struct {
			name string
			scan func([]byte) bool
		}{
			{"scanner", func(b []byte) bool { _, err := scanTopLevelKey(b, "id"); return err == nil }},
			{"before", func(b []byte) bool { _, err := refScanTopLevelKey(b, "id"); return err == nil }},
			{"json.Valid", json.Valid},
			{"json.Decoder", func(b []byte) bool { _, _, ok := topLevelIDKeys(string(b)); return ok }},
		} {
			b.Run(s.name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if !impl.scan(body) {
						b.Fatal("refused")
					}
				}
			})
		}
	}
}
