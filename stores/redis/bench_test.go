package redis

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

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
	newStore := func(b *testing.B, s *Store) *Store {
		s.Address = []string{srv.Addr}
		s.logger = zap.NewNop()
		s = provisionRedisStore(b, s)
		if s.cache != nil {
			for deadline := time.Now().Add(10 * time.Second); !s.cache.Live(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("no tracking connection")
				}
			}
		}
		return s
	}
	rec := dedup.DoneRecord{ProcessedAt: testNow, EventType: "payment_intent.succeeded"}
	var seq atomic.Int64
	newEvents := func(s *Store) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					key := testKeyPrefix + "evt_bench_" + strconv.FormatInt(seq.Add(1), 10)
					tok := newToken()
					if res, _, err := s.Claim(ctx, key, tok, 30*time.Second); err != nil || res != dedup.Claimed {
						b.Fatalf("claim: %v %v", res, err)
					}
					if held, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil || !held {
						b.Fatalf("commit: %v %v", held, err)
					}
				}
			})
		}
	}
	duplicates := func(s *Store) func(b *testing.B) {
		return func(b *testing.B) {
			ctx := context.Background()
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = testKeyPrefix + "evt_dup_" + strconv.FormatInt(seq.Add(1), 10)
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
					if res, _, err := s.Claim(ctx, keys[i%len(keys)], "tok", time.Minute); err != nil || res != dedup.AlreadyDone {
						b.Fatalf("claim: %v %v", res, err)
					}
				}
			})
		}
	}
	// in flight: every claim meets another delivery's live lease (a
	// redelivery while the first attempt runs).
	inFlight := func(s *Store) func(b *testing.B) {
		return func(b *testing.B) {
			ctx := context.Background()
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = testKeyPrefix + "evt_live_" + strconv.FormatInt(seq.Add(1), 10)
				_, _, _ = s.Claim(ctx, keys[i], newToken(), time.Hour)
			}
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1))
				for pb.Next() {
					i++
					if res, _, err := s.Claim(ctx, keys[i%len(keys)], "tok", time.Minute); err != nil || res != dedup.InFlight {
						b.Fatalf("claim: %v %v", res, err)
					}
				}
			})
		}
	}
	b.Run("inflight/pipe", inFlight(newStore(b, &Store{LocalCache: &off})))
	b.Run("new/pipe", newEvents(newStore(b, &Store{LocalCache: &off})))
	ap := newStore(b, &Store{LocalCache: &off, PoolSize: 9})
	apc, err := ap.client.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	ap.pipe, ap.cmd = nil, apc
	b.Run("new/autopipeline", newEvents(ap))
	b.Run("new/autopipeline-fd", newEvents(fullDuplex(b, newStore(b, &Store{LocalCache: &off, PoolSize: 10}), srv.Addr)))
	b.Run("new/pool", newEvents(newStore(b, &Store{LocalCache: &off, DisablePipeline: true})))
	b.Run("duplicate/cache", duplicates(newStore(b, &Store{PoolSize: 7})))
	b.Run("duplicate/no-cache", duplicates(newStore(b, &Store{LocalCache: &off, PoolSize: 8})))
}

// fullDuplex points s at go-redis's auto-pipeliner in its full-duplex
// mode (one held connection, a writer and a reader goroutine), the
// tuned alternative to the store's own pipe (issue 17's A/B).
func fullDuplex(b *testing.B, s *Store, addr string) *Store {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true,
		AutoPipelineOptions: &goredis.AutoPipelineOptions{FullDuplex: true, MaxBatchSize: 300}})
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
	rec := dedup.DoneRecord{ProcessedAt: testNow, EventType: "payment_intent.succeeded"}
	var run atomic.Int64
	for _, c := range []struct {
		name  string
		cache *int
		fd    bool
	}{{"pipe/cache", &on, false}, {"pipe/no-cache", &off, false}, {"autopipeline-fd/no-cache", &off, true}} {
		b.Run(c.name, func(b *testing.B) {
			var stores [3]*Store
			for i := range stores {
				s := &Store{Address: []string{srv.Addr}, LocalCache: c.cache, PoolSize: 20 + int(run.Add(1))}
				s.logger = zap.NewNop()
				s = provisionRedisStore(b, s)
				if c.fd {
					s = fullDuplex(b, s, srv.Addr)
				}
				stores[i] = s
			}
			prefix := testKeyPrefix + "real" + strconv.FormatInt(run.Add(1), 10) + "_"
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
					if res == dedup.Claimed {
						if _, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil {
							b.Fatalf("commit: %v", err)
						}
					}
				}
			})
		})
	}
}

// BenchmarkRedisBytesPerRecord reports what a processed event costs in
// Redis's memory (issue 27 item 1): the growth of used_memory per
// record, written by the store's own two commands per event (Claim's
// SET NX GET PX, then Commit's SET GET PX retention) for 1,000,000
// events (SANGHO_RECORDS to change it) with 41-byte keys (key_prefix
// sangho_dedup: and a Stripe-length ID) and 72 h retention, and
// MEMORY USAGE of one key. json: the done record as the store wrote it
// before compact records (the same SET with dedup.DoneRecord.Encode);
// compact: the store's Commit; each with a 24- and a 12-character event
// type; whatif: what would reach 150 B. The database is emptied before
// each, so each starts equal.
//
//	go test -run XXX -bench RedisBytesPerRecord -benchtime 1x ./stores/redis/
func BenchmarkRedisBytesPerRecord(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("SANGHO_RECORDS")); err == nil && v > 0 {
		n = v
	}
	srv := startRedis(b)
	c := srv.Client(b)
	off := 0
	s := &Store{Address: []string{srv.Addr}, LocalCache: &off}
	s.logger = zap.NewNop()
	s = provisionRedisStore(b, s)
	ctx := context.Background()
	used := func() int64 { return redistest.UsedMemory(b, c) }
	const retention = 72 * time.Hour
	// the fingerprint as the handler writes it (xxh64), and as versions
	// before it did (16 bytes of SHA-256 in hex: their JSON records)
	const xxh, sha = "x0123456789abcdef", "0123456789abcdef0123456789abcdef"
	for _, v := range []struct {
		name, typ, fp string
		compact       bool
		key           string // the key's format, of the event's number
	}{
		{"json-sha256/type24", "payment_intent.succeeded", sha, false, key41},
		{"compact-sha256/type24", "payment_intent.succeeded", sha, true, key41},
		{"compact/type24", "payment_intent.succeeded", xxh, true, key41},
		{"json-sha256/type12", "invoice.paid", sha, false, key41},
		{"compact/type12", "invoice.paid", xxh, true, key41},
		// what would reach 150 B: no event type and 12-byte keys (say
		// 12 bytes of a hash of key_prefix + ID)
		{"whatif/notype", "", xxh, true, key41},
		{"whatif/notype-key12", "", xxh, true, "%012d"},
	} {
		fp := v.fp
		b.Run(v.name, func(b *testing.B) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			before := used()
			rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: v.typ, Fingerprint: fp}
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(n); i = next.Add(1) {
						key := fmt.Sprintf(v.key, i)
						tok := newToken() + "." + fp
						if res, _, err := s.Claim(ctx, key, tok, 30*time.Second); err != nil || res != dedup.Claimed {
							b.Errorf("claim: %v %v", res, err)
							return
						}
						var err error
						if v.compact {
							_, err = s.Commit(ctx, key, tok, rec, retention)
						} else {
							_, _, err = s.set(ctx, key, "", rec.Encode(), "", retention, false)
						}
						if err != nil {
							b.Errorf("commit: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			one := fmt.Sprintf(v.key, 1)
			val, _ := c.Get(ctx, one).Result()
			mu, _ := c.MemoryUsage(ctx, one).Result()
			perRecord := float64(used()-before) / float64(n)
			b.ReportMetric(perRecord, "B/record")
			b.Logf("%d records, key %d B, value %d B, used_memory +%.1f B/record, MEMORY USAGE %d B",
				n, len(one), len(val), perRecord, mu)
		})
	}
}

// key41 is a 41-byte key: key_prefix sangho_dedup: and a Stripe-length
// event ID (28 characters).
const key41 = testKeyPrefix + "evt_1QZ%021d"
