package postgres

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// The store's PostgreSQL cost per new event (Claim then Commit) against
// the seed's own recipe, one INSERT … ON CONFLICT DO NOTHING per event,
// on one server in one run, 32 clients each, synchronous_commit on, with
// the tables empty and holding 1 M rows (SANGHO_PG_ROWS sets the second
// size), the sides taking turns of chunkEvents events; beside them the
// floor of two statements (floor-x-seed). Reported per
// event and side: the server's CPU (postmaster and backends, from
// /proc), WAL bytes, the statements' planning (pg_stat_statements with
// track_planning); the store's CPU as a multiple of the seed's (x-seed),
// its share of HOT updates and its table's bytes per row.
//
// Each side first runs warmEvents events, untimed, so that the measured
// ones run on connections as a long-lived pool has them: pgx prepares
// each statement once per connection, and PostgreSQL plans its first
// five executions on a connection before it settles on a plan. Their
// CPU is reported apart (cold-pg-µs/event): what a new connection costs.
func BenchmarkPostgresVsSeed(b *testing.B) {
	srv := pgtest.Start(b, "synchronous_commit=on", "max_connections=100",
		"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_planning=on")
	ctx := context.Background()
	big := 1_000_000
	if v := os.Getenv("SANGHO_PG_ROWS"); v != "" {
		big, _ = strconv.Atoi(v)
	}
	for _, rows := range []int{0, big} {
		table := uniqueTable()
		// The store with its default pool unless SANGHO_PG_MAX_CONNS
		// says otherwise: its groups (group.go) use half of it.
		opts := []string{"cleanup_interval", "1h"}
		if v := os.Getenv("SANGHO_PG_MAX_CONNS"); v != "" {
			opts = append(opts, "max_conns", v)
		}
		s, _ := provision(b, storeJSON(srv.DSN, table, opts...))
		if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil { // creates the table
			b.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, srv.DSN+"&pool_max_conns=32")
		if err != nil {
			b.Fatal(err)
		}
		seed := table + "_seed"
		floor := table + "_floor"
		for _, t := range []string{seed, floor} {
			srv.Psql(b, `CREATE TABLE `+t+` (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`)
		}
		if rows > 0 {
			srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id) SELECT 'evt_old_' || g FROM generate_series(1, %d) g`, seed, rows))
			srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id) SELECT 'evt_old_' || g FROM generate_series(1, %d) g`, floor, rows))
			srv.Psql(b, `VACUUM ANALYZE `+floor)
			srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id, processed_at, event_type, fingerprint, expires_at)
  SELECT 'sangho_dedup:evt_old_' || g, now(), 'bench', 'x' || left(md5(g::text), 16), now() + interval '72 hours' FROM generate_series(1, %d) g`, table, rows))
			srv.Psql(b, `VACUUM ANALYZE `+seed)
			srv.Psql(b, `VACUUM ANALYZE `+table)
		}
		// the fingerprint as the handler writes it: "x" and 16 hex digits
		rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "bench", Fingerprint: "x0123456789abcdef"}
		srv.Psql(b, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
		var seq atomic.Int64
		events := func(b *testing.B, n int, one func(key string) error) {
			var wg sync.WaitGroup
			var next atomic.Int64
			for range 32 {
				wg.Go(func() {
					for next.Add(1) <= int64(n) {
						if err := one(fmt.Sprintf("evt_%d_%d", rows, seq.Add(1))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		}
		wal := func(b *testing.B) int64 {
			var v int64
			if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&v); err != nil {
				b.Fatal(err)
			}
			return v
		}
		sides := []struct {
			name string
			one  func(key string) error
		}{
			{"seed", func(key string) error {
				_, err := pool.Exec(ctx, `INSERT INTO `+seed+` (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, key)
				return err
			}},
			// The floor of any design with a claim and a commit: the
			// seed's INSERT, then an UPDATE of the row it wrote, two
			// transactions.
			{"floor", func(key string) error {
				if _, err := pool.Exec(ctx, `INSERT INTO `+floor+` (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, key); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, `UPDATE `+floor+` SET processed_at = now() WHERE event_id = $1`, key)
				return err
			}},
			{"store", func(key string) error {
				key = "sangho_dedup:" + key
				if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
					return fmt.Errorf("claim: %v, %v", res, err)
				}
				_, err := s.Commit(ctx, key, "tok", rec, 72*time.Hour)
				return err
			}},
		}
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			b.StopTimer()
			pool.Reset() // both sides start on new connections
			s.db.pool.Reset()
			// the closed connections' backends leave /proc (and their
			// CPU the sum) before the count starts
			time.Sleep(time.Second)
			for _, side := range sides {
				cpu0 := serverCPU(b, srv)
				events(b, warmEvents, side.one)
				b.ReportMetric(float64(serverCPU(b, srv)-cpu0)/float64(time.Microsecond)/warmEvents, side.name+"-cold-pg-µs/event")
			}
			srv.Psql(b, `SELECT pg_stat_statements_reset()`)
			srv.Psql(b, `SELECT pg_stat_reset()`)
			cpu := make([]time.Duration, len(sides))
			wb := make([]int64, len(sides))
			b.StartTimer()
			for done := 0; done < b.N; done += chunkEvents {
				n := min(chunkEvents, b.N-done)
				for i, side := range sides {
					cpu0, wal0 := serverCPU(b, srv), wal(b)
					events(b, n, side.one)
					cpu[i] += serverCPU(b, srv) - cpu0
					wb[i] += wal(b) - wal0
				}
			}
			b.StopTimer()
			per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(b.N) }
			for i, side := range sides {
				b.ReportMetric(per(cpu[i]), side.name+"-pg-µs/event")
				b.ReportMetric(float64(wb[i])/float64(b.N), side.name+"-WAL-B/event")
			}
			b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "floor-x-seed")
			b.ReportMetric(float64(cpu[2])/float64(cpu[0]), "x-seed")
			var seedPlans, seedPlanMs, plans, planMs float64
			if err := pool.QueryRow(ctx, `SELECT
  coalesce(sum(plans) FILTER (WHERE query LIKE '%_seed %'), 0), coalesce(sum(total_plan_time) FILTER (WHERE query LIKE '%_seed %'), 0),
  coalesce(sum(plans) FILTER (WHERE query NOT LIKE '%_seed %' AND query NOT LIKE '%_floor %'), 0),
  coalesce(sum(total_plan_time) FILTER (WHERE query NOT LIKE '%_seed %' AND query NOT LIKE '%_floor %'), 0)
  FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%'`).Scan(&seedPlans, &seedPlanMs, &plans, &planMs); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(seedPlans/float64(b.N), "seed-plans/event")
			b.ReportMetric(seedPlanMs*1000/float64(b.N), "seed-plan-µs/event")
			b.ReportMetric(plans/float64(b.N), "store-plans/event")
			b.ReportMetric(planMs*1000/float64(b.N), "store-plan-µs/event")
			time.Sleep(600 * time.Millisecond) // the statistics collector's flush
			var upd, hot float64
			if err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&upd, &hot); err != nil {
				b.Fatal(err)
			}
			if upd > 0 {
				b.ReportMetric(100*hot/upd, "HOT-%")
			}
			var size, n float64
			if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), (SELECT count(*) FROM `+table+`)`, table).Scan(&size, &n); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(size/n, "table-B/row")
		})
		pool.Close()
	}
}

// warmEvents are the events each side runs before the measured ones:
// 20 per client, so that each of the 32 connections has run its
// statements past the five custom plans.
const warmEvents = 32 * 20

// chunkEvents are the events one side runs before the next takes its
// turn: the sides alternate through the measured events, so that the
// load of a shared machine weighs on both alike.
const chunkEvents = 500

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

// One sweep pass over a table of SANGHO_PG_ROWS rows (default 1 M), one
// in three an expired done record, with statistics that say the table
// is empty (analyzed before the fill, autovacuum off), while 8 clients
// claim new events: the p50, p99 and max of the sweep's batches and of
// the claims during the pass, and beside it the claims' p99 without a
// sweep.
func BenchmarkPostgresSweep(b *testing.B) {
	srv := pgtest.Start(b, "synchronous_commit=on", "autovacuum=off")
	ctx := context.Background()
	rows := 1_000_000
	if v := os.Getenv("SANGHO_PG_ROWS"); v != "" {
		rows, _ = strconv.Atoi(v)
	}
	table := uniqueTable()
	s, _ := provision(b, storeJSON(srv.DSN, table, "max_conns", "16", "cleanup_interval", "1h"))
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil {
		b.Fatal(err)
	}
	srv.Psql(b, `ANALYZE `+table)
	srv.Psql(b, fmt.Sprintf(`INSERT INTO %s (event_id, processed_at, event_type, fingerprint, expires_at)
  SELECT 'sangho_dedup:evt_old_' || g, now(), 'bench', md5(g::text),
    CASE WHEN g %% 3 = 0 THEN now() - interval '1 hour' ELSE now() + interval '72 hours' END
  FROM generate_series(1, %d) g`, table, rows))
	claims := func(stop <-chan struct{}) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		var seq atomic.Int64
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					t0 := time.Now()
					key := fmt.Sprint("evt_new_", seq.Add(1), "_", t0.UnixNano())
					if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(t0)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
					time.Sleep(5 * time.Millisecond) // about 1,500 claims/s in all
				}
			})
		}
		<-stop
		wg.Wait()
		return lat
	}
	stop := make(chan struct{})
	go func() { time.Sleep(5 * time.Second); close(stop) }()
	quiet := claims(stop)
	b.ResetTimer()
	var batches []time.Duration
	stop = make(chan struct{})
	done := make(chan []time.Duration)
	go func() { done <- claims(stop) }()
	var end int64
	if err := s.db.pool.QueryRow(ctx, s.db.sql.blocks).Scan(&end); err != nil {
		b.Fatal(err)
	}
	var deleted int64
	for from := int64(0); from < end; from += sweepBlocks {
		t0 := time.Now()
		n, _, err := s.db.sweepBatch(ctx, s.db.lockKey(), from, from+sweepBlocks)
		if err != nil {
			b.Fatal(err)
		}
		batches = append(batches, time.Since(t0))
		deleted += n
	}
	close(stop)
	during := <-done
	b.StopTimer()
	if want := int64(rows / 3); deleted != want {
		b.Fatalf("deleted %d, want %d", deleted, want)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"batch", batches}, {"claim-sweeping", during}, {"claim-quiet", quiet}} {
		slices.Sort(m.d)
		q := func(p float64) time.Duration { return m.d[int(p*float64(len(m.d)-1))] }
		b.ReportMetric(ms(q(0.5)), m.name+"-p50-ms")
		b.ReportMetric(ms(q(0.99)), m.name+"-p99-ms")
		b.ReportMetric(ms(m.d[len(m.d)-1]), m.name+"-max-ms")
	}
	b.ReportMetric(float64(len(batches)), "batches")
}
