package postgres

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/pgtest"
)

// The store's PostgreSQL cost per new event (Claim then Commit) against
// the seed's own recipe, one INSERT … ON CONFLICT DO NOTHING per event,
// on one server in one run, 32 clients each, synchronous_commit on, with
// the tables empty and holding 1 M rows (SANGHO_PG_ROWS sets the second
// size). Reported per event: the server's CPU (postmaster and backends,
// from /proc), WAL bytes, and for the store the share of HOT updates.
func BenchmarkPostgresVsSeed(b *testing.B) {
	srv := pgtest.Start(b, "synchronous_commit=on", "max_connections=100")
	ctx := context.Background()
	big := 1_000_000
	if v := os.Getenv("SANGHO_PG_ROWS"); v != "" {
		big, _ = strconv.Atoi(v)
	}
	for _, rows := range []int{0, big} {
		table := uniqueTable()
		s, _ := provision(b, storeJSON(srv.DSN, table, "max_conns", "32", "cleanup_interval", "1h"))
		if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil { // creates the table
			b.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, srv.DSN+"&pool_max_conns=32")
		if err != nil {
			b.Fatal(err)
		}
		seed := table + "_seed"
		srv.Psql(b, `CREATE TABLE `+seed+` (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`)
		if rows > 0 {
			srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id) SELECT 'evt_old_' || g FROM generate_series(1, %d) g`, seed, rows))
			srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id, processed_at, event_type, fingerprint, expires_at)
  SELECT 'sangho_dedup:evt_old_' || g, now(), 'bench', md5(g::text), now() + interval '72 hours' FROM generate_series(1, %d) g`, table, rows))
			srv.Psql(b, `VACUUM ANALYZE `+seed)
			srv.Psql(b, `VACUUM ANALYZE `+table)
		}
		rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "bench", Fingerprint: "0123456789abcdef0123456789abcdef"}
		var seq atomic.Int64
		run := func(b *testing.B, one func(key string) error) {
			lsn0 := walLSN(b, srv)
			cpu0 := serverCPU(b, srv)
			b.ResetTimer()
			var wg sync.WaitGroup
			var next atomic.Int64
			for range 32 {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if err := one(fmt.Sprintf("evt_%d_%d", rows, seq.Add(1))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(serverCPU(b, srv)-cpu0)/float64(time.Microsecond)/float64(b.N), "pg-µs/event")
			b.ReportMetric(float64(walLSN(b, srv)-lsn0)/float64(b.N), "WAL-B/event")
		}
		b.Run(fmt.Sprintf("rows=%d/seed", rows), func(b *testing.B) {
			run(b, func(key string) error {
				_, err := pool.Exec(ctx, `INSERT INTO `+seed+` (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, key)
				return err
			})
		})
		b.Run(fmt.Sprintf("rows=%d/store", rows), func(b *testing.B) {
			srv.Psql(b, `SELECT pg_stat_reset()`)
			run(b, func(key string) error {
				key = "sangho_dedup:" + key
				if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
					return fmt.Errorf("claim: %v, %v", res, err)
				}
				_, err := s.Commit(ctx, key, "tok", rec, 72*time.Hour)
				return err
			})
			time.Sleep(600 * time.Millisecond) // the statistics collector's flush
			var upd, hot float64
			if err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&upd, &hot); err != nil {
				b.Fatal(err)
			}
			if upd > 0 {
				b.ReportMetric(100*hot/upd, "HOT-%")
			}
		})
		pool.Close()
	}
}

func walLSN(b *testing.B, srv *pgtest.Server) int64 {
	v, err := strconv.ParseInt(strings.TrimSpace(srv.Psql(b, `SELECT pg_current_wal_lsn() - '0/0'`)), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// serverCPU is the user and system time of the postmaster and of every
// process it forked (one per connection).
func serverCPU(b *testing.B, srv *pgtest.Server) time.Duration {
	raw, err := os.ReadFile(filepath.Join(srv.Dir, "data", "postmaster.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pm := strings.SplitN(string(raw), "\n", 2)[0]
	var ticks float64
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		st, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(st), ')')
		f := strings.Fields(string(st[i+2:]))
		if strings.TrimSuffix(filepath.Base(filepath.Dir(p)), "") == pm || f[1] == pm {
			u, _ := strconv.ParseFloat(f[11], 64)
			sy, _ := strconv.ParseFloat(f[12], 64)
			ticks += u + sy
		}
	}
	return time.Duration(ticks * float64(time.Second) / 100) // USER_HZ
}
