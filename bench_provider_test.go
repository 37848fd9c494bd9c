package sanghodedup

import (
	"context"
	"fmt"
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

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// BenchmarkServeHTTPProviders measures ServeHTTP for new events of
// sangho (the ID signed, in the body) and github (the ID in an unsigned
// header: one more claim and one more commit per event, for the replay
// record), on each store.
func BenchmarkServeHTTPProviders(b *testing.B) {
	srv := startRedis(b)
	stores := map[string]string{
		"memory": `{"type":"memory"}`,
		"file":   `{"type":"file","path":"` + b.TempDir() + `/dedup.db"}`,
		"redis":  `{"type":"redis","address":["` + srv.Addr + `"]}`,
	}
	for _, store := range []string{"memory", "file", "redis"} {
		for _, scheme := range []string{"sangho", "github"} {
			b.Run(store+"/"+scheme, func(b *testing.B) { benchProvider(b, scheme, stores[store]) })
		}
	}
}

func benchProvider(b *testing.B, scheme, store string) {
	secret := secret1
	if scheme == "github" {
		secret = ghSecret1
	}
	h := providerHandler(b, `{"name":"`+scheme+`"}`, []string{secret}, func(h *Handler) { h.StoreRaw = []byte(store) })
	h.logger = zap.NewNop()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		w.WriteHeader(200)
		return nil
	})
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	type signed struct {
		body string
		hdr  http.Header
	}
	events := make([]signed, b.N)
	for i := range events {
		id := "evt_" + prefix + "_" + strconv.Itoa(i)
		body := eventBody(id)
		if scheme == "github" {
			events[i] = signed{body, http.Header{"X-Hub-Signature-256": {githubSig(body, ghSecret1)}, "X-Github-Delivery": {id}}}
		} else {
			events[i] = signed{body, http.Header{"Sangho-Signature": {sangho.Sign(testNow, []byte(body), secret1)}}}
		}
	}
	w := httptest.NewRecorder()
	webhookURL, _ := url.Parse("/webhook")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := &http.Request{
			Method: http.MethodPost, URL: webhookURL, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: events[i].hdr, Body: io.NopCloser(strings.NewReader(events[i].body)),
			ContentLength: int64(len(events[i].body)),
		}
		r = r.WithContext(context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer()))
		w.Body.Reset()
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedisRecordBytes reports what one record costs in Redis's
// memory (used_memory before and after 100,000 of them): an event's done
// record (26-character IDs, as the README's figure) and the replay
// record of an unsigned-ID delivery (36-character GitHub GUIDs).
// Run it with -benchtime 1x.
func BenchmarkRedisRecordBytes(b *testing.B) {
	srv := startRedis(b)
	c := srv.Client(b)
	h := providerHandler(b, `{"name":"github"}`, []string{ghSecret1}, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"]}`)
		h.KeyPrefix = "sangho_dedup:"
	})
	ctx := context.Background()
	used := func() int64 { return redistest.UsedMemory(b, c) }
	const n = 100_000
	for _, kind := range []string{"event", "signature"} {
		before := used()
		for i := range n {
			id := fmt.Sprintf("evt_%022d", i) // 26 characters
			key, token, rec := h.KeyPrefix+id, "tok", dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "payment_intent.succeeded"}
			if kind == "signature" {
				id = fmt.Sprintf("72d3162e-cc78-11e3-81ab-%012d", i) // a GitHub GUID
				key, token, rec = signatureKey(h.KeyPrefix, nil, []byte(eventBody(id)), nil), id, dedup.DoneRecord{ProcessedAt: time.Now(), EventType: id}
			}
			if _, _, err := h.store.Claim(ctx, key, token, time.Hour); err != nil {
				b.Fatal(err)
			}
			if _, err := h.store.Commit(ctx, key, token, rec, 72*time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(used()-before)/n, kind+"-bytes/record")
	}
}
