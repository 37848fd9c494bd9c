package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// bouncerDSN reaches the database postgres as the superuser through b,
// with query exec mode mode.
func bouncerDSN(b *pgtest.Bouncer, mode string) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&default_query_exec_mode=%s", b.Addr, mode)
}

// advisoryLocks counts the advisory locks held on the server.
func advisoryLocks(t *testing.T, srv *pgtest.Server) string {
	t.Helper()
	return srv.Psql(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`)
}

// Behind PgBouncer in transaction mode, every sweep sweeps and leaves no
// advisory lock behind: each batch takes its lock inside its own
// transaction, which the pooler keeps on one server connection. A
// session-level lock taken in one transaction and released in another
// lands on two server connections: the release fails ("you don't own a
// lock"), the lock stays on an idle server connection, and later sweeps
// skip. server_round_robin hands each transaction the least recently
// used server connection, as a busy pool does.
func TestSweepBehindPgBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	b := pgtest.StartBouncer(t, srv, []string{"postgres"}, "server_round_robin = 1", "min_pool_size = 4")
	table := uniqueTable()
	s, _ := provision(t, storeJSON(bouncerDSN(b, "exec"), table, "cleanup_interval", "1h"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	for round := range 9 {
		for i := range 3 { // done records that expire at once (a lease would stay, a mark)
			key := fmt.Sprintf("r%d-%d", round, i)
			if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Commit(ctx, key, "tok", dedup.DoneRecord{ProcessedAt: time.Now()}, time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Millisecond)
		n, swept, err := s.db.sweep(ctx)
		if err != nil {
			t.Fatalf("round %d: sweep: %v", round, err)
		}
		if !swept || n != 3 {
			t.Fatalf("round %d: swept %v, deleted %d; want 3 deleted: no other instance sweeps", round, swept, n)
		}
		if l := advisoryLocks(t, srv); l != "0" {
			t.Fatalf("round %d: %s advisory locks held after the sweep", round, l)
		}
	}
	log, _ := os.ReadFile(srv.Log())
	if n := strings.Count(string(log), "you don't own a lock"); n > 0 {
		t.Fatalf("%d \"you don't own a lock\" warnings in the server's log", n)
	}

	// Another instance sweeping (its batch's transaction holds the lock):
	// this one skips the round, then sweeps once it is done.
	other := connect(t, srv.DSN)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.db.lockKey()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "late", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "late", "tok", dedup.DoneRecord{ProcessedAt: time.Now()}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, swept, err := s.db.sweep(ctx); err != nil || swept {
		t.Fatalf("sweep while another instance holds the lock: swept %v, %v; want a skipped round", swept, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, swept, err := s.db.sweep(ctx); err != nil || !swept || n != 1 {
		t.Fatalf("sweep after the other one: %d, %v, %v", n, swept, err)
	}
}

// The whole store works behind PgBouncer in transaction mode with the
// DSN's default_query_exec_mode exec or simple_protocol, and PgBouncer's
// defaults (which refuse a statement_timeout startup parameter): every
// operation answers, and statement_timeout still bounds a statement
// that waits on a lock.
func TestStoreBehindPgBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	b := pgtest.StartBouncer(t, srv, []string{"postgres"})
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			table := uniqueTable()
			s, logs := provision(t, storeJSON(bouncerDSN(b, mode), table, "statement_timeout", "1s", "cleanup_interval", "1h"))
			everyOperation(t, s)
			if n := logs.FilterMessage("postgres statement_timeout not sent").Len(); n != 1 {
				t.Fatalf("%d log lines saying statement_timeout is not sent; want 1: %v", n, logs.All())
			}

			ctx := context.Background()
			if _, _, err := s.Claim(ctx, "held", "tok", time.Minute); err != nil {
				t.Fatal(err)
			}
			other := connect(t, srv.DSN)
			tx, err := other.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE event_id = 'held' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := s.Renew(ctx, "held", "tok", time.Minute); err == nil {
				t.Fatal("renew of a locked row succeeded")
			}
			if took := time.Since(start); took > 4*time.Second {
				t.Fatalf("renew waited %v on a locked row; statement_timeout is 1s", took)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				ok, err := s.Renew(ctx, "held", "tok", time.Minute)
				if err == nil && ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("renew after the lock went = %v, %v", ok, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if res, _, err := s.Claim(ctx, "after", "tok", time.Minute); err != nil || res != dedup.Claimed {
				t.Fatalf("claim after the timeout = %v, %v", res, err)
			}
		})
	}
}

// docs/postgres.md's pooler recipe, as a new user follows it: the role,
// the database, the grant for create_table on and the role's
// statement_timeout, then the store on the docs' DSN through PgBouncer
// in transaction mode with its defaults. Every operation answers, the
// store says once that it does not send statement_timeout, and the
// server bounds the store's statements with the role's.
func TestDocsPoolerRecipe(t *testing.T) {
	srv := pgtest.Start(t)
	docSetup(t, srv, "grant-create", "role-timeout")
	b := pgtest.StartBouncer(t, srv, []string{"caddy_dedup"})
	dsn := docDSN(t, "pooler")
	dsn = strings.Replace(dsn, "{env.PGPASSWORD}", "change-me", 1)
	dsn = strings.Replace(dsn, "pgbouncer.internal:6432", b.Addr, 1)
	if !strings.Contains(dsn, b.Addr) {
		t.Fatalf("the docs' pooler DSN %q has no pgbouncer.internal:6432 to point at the test's PgBouncer", dsn)
	}
	s, logs := provision(t, storeJSON(dsn, "", "cleanup_interval", "1h"))
	everyOperation(t, s)
	if n := logs.FilterMessage("postgres statement_timeout not sent").Len(); n != 1 {
		t.Fatalf("%d log lines saying statement_timeout is not sent; want 1", n)
	}
	var timeout string
	if err := s.db.pool.QueryRow(context.Background(), `SHOW statement_timeout`).Scan(&timeout); err != nil {
		t.Fatal(err)
	}
	if timeout != "5s" {
		t.Fatalf("statement_timeout on the store's server connections = %q; want the role's 5s", timeout)
	}
}
