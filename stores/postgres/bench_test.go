package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// The store's own cost per event, without HTTP: a new event (claim and
// commit, two statements, two WAL flushes with synchronous_commit on)
// and a duplicate (one claim that finds the done record), from 32
// goroutines as from 32 connections to Caddy.
func BenchmarkPostgres(b *testing.B) {
	srv := pgtest.Start(b, "synchronous_commit=on")
	s, _ := provision(b, storeJSON(srv.DSN, uniqueTable(), "max_conns", "32"))
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "bench"}
	var seq atomic.Int64
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16) // 32 goroutines on 2 CPUs
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := fmt.Sprintf("new_%d", seq.Add(1))
				if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
					b.Fatal(res, err)
				}
				if _, err := s.Commit(ctx, key, "tok", rec, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	if _, _, err := s.Claim(ctx, "dup", "tok", time.Minute); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Commit(ctx, "dup", "tok", rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.Run("duplicate", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if res, _, err := s.Claim(ctx, "dup", "tok2", time.Minute); err != nil || res != dedup.AlreadyDone {
					b.Fatal(res, err)
				}
			}
		})
	})
}
