package sanghodedup

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/internal/sangho"
)

// Benchmarks of the hot path. Compare side by side in one run:
//
//	go test -run '^$' -bench . -benchmem -count 5 . | tee new.txt
//
// The Redis ones start their own redis-server on a free loopback port.

func BenchmarkVerify(b *testing.B) {
	for _, size := range []int{len(bodyA), 64 << 10} {
		body := []byte(bodyA)
		if size > len(body) {
			body = []byte(`{"id":"evt_1","pad":"` + strings.Repeat("x", size-22) + `"}`)
		}
		hdr := sangho.Sign(testNow, body, secret2, secret1)
		ver := newVerifier([]string{secret1}, 5*time.Minute, func() time.Time { return testNow })
		b.Run(strconv.Itoa(len(body))+"B", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := ver.verify(hdr, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkExtractEvent(b *testing.B) {
	big := `{"data":{"object":{"items":[` + strings.Repeat(`{"id":"pi_1","note":"a \"quoted\" string"},`, 22000) + `{}]}},"id":"evt_big","type":"x"}`
	long := `{"id":"evt_long","type":"x","data":{"object":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}}`
	for name, body := range map[string]string{"small": bodyA, "1MiB-tokens": big, "64KiB-string": long} {
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
	srv := startRedis(b)
	withRedis := func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"]}`)
	}
	b.Run("redis/new", func(b *testing.B) { benchServe(b, withRedis, false) })
	b.Run("redis/duplicate", func(b *testing.B) { benchServe(b, withRedis, true) })
}

// BenchmarkRedisStore measures the store alone under concurrency (32
// goroutines on 2 CPUs, as sangho-bench's 32 connections): a new event
// is a claim and a commit; a duplicate is a claim of a processed event.
// pipe: the store's own pipelined connection; autopipeline: go-redis's
// auto-pipeliner, which the store used before on a standalone server
// (still on a Cluster); pool: disable_pipeline (go-redis's pool); cache /
// no-cache: local_cache on and off.
func BenchmarkRedisStore(b *testing.B) {
	srv := startRedis(b)
	off := 0
	newStore := func(b *testing.B, s *RedisStore) *RedisStore {
		s.Address = []string{srv.Addr}
		s.logger = zap.NewNop()
		s = provisionRedisStore(b, s)
		if s.cache != nil {
			for deadline := time.Now().Add(10 * time.Second); !s.cache.live.Load(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("no tracking connection")
				}
			}
		}
		return s
	}
	rec := DoneRecord{ProcessedAt: testNow, EventType: "payment_intent.succeeded"}
	var seq atomic.Int64
	newEvents := func(s *RedisStore) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					key := DefaultKeyPrefix + "evt_bench_" + strconv.FormatInt(seq.Add(1), 10)
					tok := newToken()
					if res, _, err := s.Claim(ctx, key, tok, 30*time.Second); err != nil || res != Claimed {
						b.Fatalf("claim: %v %v", res, err)
					}
					if held, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil || !held {
						b.Fatalf("commit: %v %v", held, err)
					}
				}
			})
		}
	}
	duplicates := func(s *RedisStore) func(b *testing.B) {
		return func(b *testing.B) {
			ctx := context.Background()
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = DefaultKeyPrefix + "evt_dup_" + strconv.FormatInt(seq.Add(1), 10)
				tok := newToken()
				_, _, _ = s.Claim(ctx, keys[i], tok, time.Minute)
				_, _ = s.Commit(ctx, keys[i], tok, rec, time.Hour)
			}
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1))
				for pb.Next() {
					i++
					if res, _, err := s.Claim(ctx, keys[i%len(keys)], "tok", time.Minute); err != nil || res != AlreadyDone {
						b.Fatalf("claim: %v %v", res, err)
					}
				}
			})
		}
	}
	b.Run("new/pipe", newEvents(newStore(b, &RedisStore{LocalCache: &off})))
	ap := newStore(b, &RedisStore{LocalCache: &off, PoolSize: 9})
	apc, err := ap.client.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	ap.pipe, ap.cmd = nil, apc
	b.Run("new/autopipeline", newEvents(ap))
	b.Run("new/autopipeline-fd", newEvents(fullDuplex(b, newStore(b, &RedisStore{LocalCache: &off, PoolSize: 10}), srv.Addr)))
	b.Run("new/pool", newEvents(newStore(b, &RedisStore{LocalCache: &off, DisablePipeline: true})))
	b.Run("duplicate/cache", duplicates(newStore(b, &RedisStore{PoolSize: 7})))
	b.Run("duplicate/no-cache", duplicates(newStore(b, &RedisStore{LocalCache: &off, PoolSize: 8})))
}

// fullDuplex points s at go-redis's auto-pipeliner in its full-duplex
// mode (one held connection, a writer and a reader goroutine), the
// tuned alternative to the store's own pipe (issue 17's A/B).
func fullDuplex(b *testing.B, s *RedisStore, addr string) *RedisStore {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		AutoPipelineOptions: &redis.AutoPipelineOptions{FullDuplex: true, MaxBatchSize: 300}})
	b.Cleanup(func() { c.Close() })
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	s.pipe, s.cmd = nil, ap
	return s
}

// BenchmarkRedisRealisticRedelivery: deliveries as a sender makes them
// (issue 17's A/B): every event is delivered once and redelivered 1 to
// 3 times, the redeliveries spread over the run (up to 4,096 deliveries
// later), each delivery to one of 3 Caddy instances (3 stores, each
// with its own client) at random. A delivery is a claim, and a commit
// when it claimed. Compares the store's own pipe and go-redis's
// auto-pipeliner (full duplex), with the local cache on and off: the
// cache only answers a redelivery that reaches an instance which has
// already seen the event done.
func BenchmarkRedisRealisticRedelivery(b *testing.B) {
	srv := startRedis(b)
	off, on := 0, 10000
	// the deliveries, in order: a fixed pseudo-random plan
	const events = 1 << 15
	type delivery struct {
		event    int
		instance int
	}
	rng := uint64(0x9e3779b97f4a7c15)
	next := func(n int) int { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return int(rng % uint64(n)) }
	type timed struct {
		at int // in events: event e is first delivered at e*8
		d  delivery
	}
	var all []timed
	for e := 0; e < events; e++ {
		all = append(all, timed{e * 8, delivery{e, next(3)}})
		for range 1 + next(3) {
			all = append(all, timed{e*8 + 8 + next(4096*8), delivery{e, next(3)}})
		}
	}
	slices.SortStableFunc(all, func(a, b timed) int { return a.at - b.at })
	plan := make([]delivery, len(all))
	for i, t := range all {
		plan[i] = t.d
	}
	rec := DoneRecord{ProcessedAt: testNow, EventType: "payment_intent.succeeded"}
	var run atomic.Int64
	for _, c := range []struct {
		name  string
		cache *int
		fd    bool
	}{{"pipe/cache", &on, false}, {"pipe/no-cache", &off, false}, {"autopipeline-fd/no-cache", &off, true}} {
		b.Run(c.name, func(b *testing.B) {
			var stores [3]*RedisStore
			for i := range stores {
				s := &RedisStore{Address: []string{srv.Addr}, LocalCache: c.cache, PoolSize: 20 + int(run.Add(1))}
				s.logger = zap.NewNop()
				s = provisionRedisStore(b, s)
				if c.fd {
					s = fullDuplex(b, s, srv.Addr)
				}
				stores[i] = s
			}
			prefix := DefaultKeyPrefix + "real" + strconv.FormatInt(run.Add(1), 10) + "_"
			var pos atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := pos.Add(1) - 1
					d := plan[i%int64(len(plan))]
					key := prefix + strconv.FormatInt(i/int64(len(plan)), 10) + "_" + strconv.Itoa(d.event)
					s := stores[d.instance]
					tok := newToken()
					res, _, err := s.Claim(ctx, key, tok, 30*time.Second)
					if err != nil {
						b.Fatalf("claim: %v", err)
					}
					if res == Claimed {
						if _, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil {
							b.Fatalf("commit: %v", err)
						}
					}
				}
			})
		})
	}
}
