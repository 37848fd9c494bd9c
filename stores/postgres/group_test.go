package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// gate holds the store's one group worker (max_conns 2) once it took a
// group's first statement, until open is called after queued statements
// wait behind it: they then go in its group.
type gate struct {
	s     *Store
	taken chan struct{}
	hold  chan struct{}
	once  sync.Once
}

func newGate(t *testing.T, s *Store) *gate {
	t.Helper()
	if n := groupWorkers(s.db.opts.config.MaxConns); n != 1 {
		t.Fatalf("%d group workers; the gate needs one (max_conns 2)", n)
	}
	g := &gate{s: s, taken: make(chan struct{}), hold: make(chan struct{})}
	var first sync.Once
	// Set while the worker waits for a statement (each earlier read of
	// took came before the answers this test received), and before it
	// takes the next one: the queue's send orders this write before
	// that read.
	s.db.group.took = func() {
		first.Do(func() {
			close(g.taken)
			<-g.hold
		})
	}
	return g
}

// queued waits (5 s at most) until n statements wait in the queue.
func (g *gate) queued(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(g.s.db.group.q) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d statements queued after 5s; want %d", len(g.s.db.group.q), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.hold) }) }

// took waits (5 s at most) until the worker took a group's first
// statement.
func (g *gate) took(t *testing.T) {
	t.Helper()
	select {
	case <-g.taken:
	case <-time.After(5 * time.Second):
		t.Fatal("no statement reached the group worker in 5s")
	}
}

// grouped is the answer to one claim of claimGrouped.
type grouped struct {
	res  dedup.ClaimResult
	err  error
	took time.Duration
}

// claimGrouped claims first and holds the store's group worker on it,
// queues a claim of each key behind it (in ctxOf's context, else ctx),
// then lets the group go: first and keys are sent as one group. It
// returns each key's answer.
func claimGrouped(t *testing.T, s *Store, ctx context.Context, first string, keys []string, ctxOf map[string]context.Context) []grouped {
	t.Helper()
	g := newGate(t, s)
	defer g.open()
	var wg sync.WaitGroup
	wg.Go(func() { s.Claim(ctx, first, "tok", time.Minute) }) //nolint:errcheck
	g.took(t)
	out := make([]grouped, len(keys))
	for i, k := range keys {
		kctx := ctx
		if c, ok := ctxOf[k]; ok {
			kctx = c
		}
		wg.Go(func() {
			start := time.Now()
			out[i].res, _, out[i].err = s.Claim(kctx, k, "tok", time.Minute)
			out[i].took = time.Since(start)
		})
	}
	g.queued(t, len(keys))
	g.open()
	wg.Wait()
	return out
}

// xmins counts the transactions that wrote the rows of keys with prefix.
func xmins(t *testing.T, srv *pgtest.Server, table, prefix string) string {
	t.Helper()
	return srv.Psql(t, `SELECT count(DISTINCT xmin::text) || ' ' || count(*) FROM `+table+` WHERE event_id LIKE '`+prefix+`%'`)
}

// New events' claims and held leases' commits that wait together are
// written by one transaction, and each is answered as its statement
// alone would be; a claim whose caller gave up before its group left is
// not sent.
func TestGroupCommit(t *testing.T) { eachMode(t, testGroupCommit) }

// eachMode runs f on a server directly and behind PgBouncer in
// transaction mode with each exec mode it needs (docs/postgres.md): a
// group is one transaction in each.
func eachMode(t *testing.T, f func(t *testing.T, srv *pgtest.Server, dsn string)) {
	srv := pgtest.Start(t)
	t.Run("server", func(t *testing.T) { f(t, srv, srv.DSN) })
	b := pgtest.StartBouncer(t, srv, []string{"postgres"})
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run("pgbouncer-"+mode, func(t *testing.T) { f(t, srv, bouncerDSN(b, mode)) })
	}
}

func testGroupCommit(t *testing.T, srv *pgtest.Server, dsn string) {
	table := uniqueTable()
	s, _ := provision(t, storeJSON(dsn, table, "max_conns", "2", "cleanup_interval", "1h"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil { // creates the table
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "g-dup", "other", time.Minute); err != nil { // a lease in flight
		t.Fatal(err)
	}
	g := newGate(t, s)
	defer g.open()

	const n = 10
	results := make([]dedup.ClaimResult, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	claim := func(i int, key string) {
		wg.Go(func() { results[i], _, errs[i] = s.Claim(ctx, key, fmt.Sprintf("tok%d", i), time.Minute) })
	}
	claim(0, "g-00")
	g.took(t)
	for i := 1; i < n; i++ {
		claim(i, fmt.Sprintf("g-%02d", i))
	}
	claim(n, "g-dup")
	// a delivery that gives up while its claim waits
	gone, cancel := context.WithCancel(ctx)
	goneErr := make(chan error, 1)
	go func() { _, _, err := s.Claim(gone, "g-gone", "tok", time.Minute); goneErr <- err }()
	g.queued(t, n+1)
	cancel()
	if err := <-goneErr; err == nil {
		t.Fatal("a claim whose context was canceled answered no error")
	}
	g.open()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i] != dedup.Claimed {
			t.Fatalf("claim %d = %v, %v; want claimed", i, results[i], errs[i])
		}
	}
	if errs[n] != nil || results[n] != dedup.InFlight {
		t.Fatalf("claim of a key in flight, in a group = %v, %v; want in flight", results[n], errs[n])
	}
	// g-00, taken first, and the nine that waited behind it (and g-dup's
	// insert, which changed nothing) in one transaction.
	if got := xmins(t, srv, table, "g-0"); got != "1 10" {
		t.Fatalf("transactions, rows of the claims = %s; want 1 10", got)
	}
	if got := srv.Psql(t, `SELECT count(*) FROM `+table+` WHERE event_id = 'g-gone'`); got != "0" {
		t.Fatal("the claim whose caller gave up was sent")
	}

	// The commits, the same way.
	g2 := newGate(t, s)
	defer g2.open()
	rec := dedup.DoneRecord{ProcessedAt: time.Now().UTC().Truncate(time.Microsecond), EventType: "t", Fingerprint: "x0123456789abcdef"}
	helds := make([]bool, n)
	for i := range n {
		wg.Go(func() {
			helds[i], errs[i] = s.Commit(ctx, fmt.Sprintf("g-%02d", i), fmt.Sprintf("tok%d", i), rec, time.Hour)
		})
		if i == 0 {
			g2.took(t)
		}
	}
	g2.queued(t, n-1)
	g2.open()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !helds[i] {
			t.Fatalf("commit %d = %v, %v; want held", i, helds[i], errs[i])
		}
		if e, err := s.Get(ctx, fmt.Sprintf("g-%02d", i)); err != nil || e.Value != rec.Encode() {
			t.Fatalf("record %d = %q, %v; want %q", i, e.Value, err, rec.Encode())
		}
	}
	if got := xmins(t, srv, table, "g-0"); got != "1 10" {
		t.Fatalf("transactions, rows of the commits = %s; want 1 10", got)
	}
}

// A statement the server refuses rolls its group back; every other
// statement of the group then runs alone and lands, and only the bad
// one's caller gets an error.
func TestGroupOneBadStatement(t *testing.T) { eachMode(t, testGroupOneBadStatement) }

func testGroupOneBadStatement(t *testing.T, srv *pgtest.Server, dsn string) {
	table := uniqueTable()
	s, _ := provision(t, storeJSON(dsn, table, "max_conns", "2", "cleanup_interval", "1h"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	// A NUL byte is no text PostgreSQL stores; the key sorts last, after
	// the good statements it aborts.
	keys := []string{"b-1", "b-2", "b-3", "b-4", "b-z\x00"}
	got := claimGrouped(t, s, ctx, "b-first", keys, nil)
	for i, k := range keys[:4] {
		if got[i].err != nil || got[i].res != dedup.Claimed {
			t.Fatalf("claim of %s beside a bad one = %v, %v; want claimed", k, got[i].res, got[i].err)
		}
	}
	if got[4].err == nil {
		t.Fatal("the claim of a key with a NUL byte answered no error")
	}
	if got := srv.Psql(t, `SELECT string_agg(event_id || '=' || lease_token, ',' ORDER BY event_id) FROM `+table+` WHERE event_id LIKE 'b-_'`); got != "b-1=tok,b-2=tok,b-3=tok,b-4=tok" {
		t.Fatalf("leases in the table: %s; want b-1 … b-4 held by tok", got)
	}
	if n := s.db.group.reran.Load(); n != 1 {
		t.Fatalf("%d groups rolled back and run alone; want 1", n)
	}
}

// A statement of a group that waits for a row lock another transaction
// holds (an operator's open transaction, a stuck session) fails its own
// delivery only: the server gives up on the lock before the group's
// time runs out, the group is rolled back and each statement runs
// alone. Before, the group waited until Caddy's deadline and every
// delivery in it got the store error.
func TestGroupLockWaitFailsOnlyItsOwn(t *testing.T) { eachMode(t, testGroupLockWait) }

func testGroupLockWait(t *testing.T, srv *pgtest.Server, dsn string) {
	table := uniqueTable()
	s, _ := provision(t, storeJSON(dsn, table, "max_conns", "2", "cleanup_interval", "1h", "statement_timeout", `"2s"`))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil { // creates the table
		t.Fatal(err)
	}
	// Another session inserts l-held and neither commits nor rolls back
	// until the test ends: a claim of it waits to know which.
	holdRow(t, srv, table, "l-held")

	keys := []string{"l-1", "l-2", "l-3", "l-held", "l-4"}
	for i, a := range claimGrouped(t, s, ctx, "l-first", keys, nil) {
		if keys[i] == "l-held" {
			if a.err == nil {
				t.Errorf("the claim of the locked row answered %v and no error while the lock was held", a.res)
			}
			continue
		}
		if a.err != nil || a.res != dedup.Claimed {
			t.Errorf("claim of %s in a group with a statement waiting for a lock = %v, %v; want claimed", keys[i], a.res, a.err)
		}
	}
}

// holdRow: another session inserts key into table and keeps its
// transaction open until the test ends.
func holdRow(t *testing.T, srv *pgtest.Server, table, key string) {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close(ctx) })
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, lease_token, expires_at) VALUES ($1, 'other', now() + interval '1 minute')`, key); err != nil {
		t.Fatal(err)
	}
}

// The group's lock_timeout is never longer than the one the operator
// set (here in the DSN; ALTER ROLE or DATABASE ... SET alike): a group
// waiting for a lock is refused at the operator's 200ms, and its other
// statements run alone at once, as before the group set its own.
// (Found by review: half the group's time, 2s here, replaced it.)
func TestGroupKeepsAShorterLockTimeout(t *testing.T) {
	srv, s, table := warmGroupStore(t, "&lock_timeout=200")
	ctx := context.Background()
	holdRow(t, srv, table, "l-held")
	keys := []string{"l-1", "l-2", "l-held"}
	for i, a := range claimGrouped(t, s, ctx, "l-first", keys, nil) {
		if keys[i] != "l-held" && (a.err != nil || a.took > time.Second) {
			t.Errorf("claim of %s: %v after %v; want claimed within about the 200ms lock_timeout configured", keys[i], a.err, a.took.Round(time.Millisecond))
		}
	}
}

// The group's lock_timeout is half the time its earliest caller has
// left: a caller that queued longer is answered in its time too.
// (Found by review: it was half the latest caller's time, and a caller
// with 1.5s left of 4s got the store error though its own statement
// waited for nothing.)
func TestGroupLockTimeoutOfTheEarliestCaller(t *testing.T) {
	srv, s, table := warmGroupStore(t, "")
	ctx := context.Background()
	holdRow(t, srv, table, "l-held")
	// l-1's caller has 1.5s left (as one queued 2.5s earlier would);
	// the others have the whole 4s.
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	got := claimGrouped(t, s, ctx, "l-first", []string{"l-1", "l-held", "l-2"}, map[string]context.Context{"l-1": short})
	if got[0].err != nil || got[0].res != dedup.Claimed {
		t.Errorf("claim of l-1 (1.5s left) in a group waiting for a lock: %v, %v; want claimed (alone it had the time)", got[0].res, got[0].err)
	}
}

// warmGroupStore starts a server and provisions a store on it with one
// group worker (max_conns 2) and statement_timeout 4s, its DSN with
// dsnSuffix, on a new table that a first claim creates.
func warmGroupStore(t *testing.T, dsnSuffix string) (*pgtest.Server, *Store, string) {
	t.Helper()
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN+dsnSuffix, table, "max_conns", "2", "cleanup_interval", "1h", "statement_timeout", `"4s"`))
	if _, _, err := s.Claim(context.Background(), "warm", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	return srv, s, table
}

// TestLockTimeoutLeavesOutACallerWithoutTime: a caller with under 2 ms
// left, whose half is under PostgreSQL's millisecond, does not take the
// group's lock_timeout away: the limit is the half of the earliest
// caller that has time for one. And a deadline weeks away is kept under
// the largest lock_timeout PostgreSQL takes (2^31-1 ms). (Found by
// review: one nearly expired caller left its whole group waiting on a
// held row until the latest deadline.)
func TestLockTimeoutLeavesOutACallerWithoutTime(t *testing.T) {
	bg := context.Background()
	long, c1 := context.WithTimeout(bg, 4*time.Second)
	defer c1()
	short, c2 := context.WithTimeout(bg, 1500*time.Microsecond)
	defer c2()
	ops := []*groupOp{{ctx: long, key: "a"}, {ctx: long, key: "b"}, {ctx: short, key: "c"}}
	lt, ok := lockTimeout(long, ops)
	if !ok {
		t.Fatal("two callers with 4s left and one with 1.5ms: no lock_timeout for the group")
	}
	if ms := lt.args[0].(int64); ms < 1500 || ms > 2000 {
		t.Fatalf("lock_timeout %d ms; want half the 4s callers' time", ms)
	}
	far, c3 := context.WithTimeout(bg, 100*24*time.Hour)
	defer c3()
	if lt, ok := lockTimeout(far, []*groupOp{{ctx: far}, {ctx: far}}); !ok || lt.args[0].(int64) > math.MaxInt32 {
		t.Fatalf("a deadline 100 days away: %v %v; want at most %d ms", lt, ok, math.MaxInt32)
	}
}

// A group's lock_timeout is its transaction's only (SET LOCAL): no
// pooled connection keeps it for the statements it runs later. (A
// session-wide set_config passed every other test.)
func TestGroupLockTimeoutDoesNotLeak(t *testing.T) {
	srv, s, table := warmGroupStore(t, "")
	ctx := context.Background()
	claimGrouped(t, s, ctx, "k-first", []string{"k-1", "k-2", "k-3"}, nil)
	if got := xmins(t, srv, table, "k-"); got != "1 4" {
		t.Fatalf("k-first, k-1 … k-3 written by %s (transactions, rows); want one group: 1 4", got)
	}
	for range 2 { // max_conns
		c, err := s.db.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		var v string
		if err := c.QueryRow(ctx, `SHOW lock_timeout`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != "0" {
			t.Errorf("a pooled connection's lock_timeout after a group: %s; want 0 (the group's was SET LOCAL)", v)
		}
	}
}

// Two statements on one key in one group: two claims of a new key (one
// claims it, the other finds it in flight), and a claim beside the
// commit of the key's lease (the commit holds, the claim finds it done).
func TestGroupSameKey(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", "2", "cleanup_interval", "1h"))
	ctx := context.Background()
	if res, _, err := s.Claim(ctx, "s-done", "A", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	g := newGate(t, s)
	defer g.open()
	var wg sync.WaitGroup
	wg.Go(func() { s.Claim(ctx, "s-first", "tok", time.Minute) }) //nolint:errcheck
	g.took(t)
	rec := dedup.DoneRecord{ProcessedAt: time.Now().UTC().Truncate(time.Microsecond), EventType: "t", Fingerprint: "x0123456789abcdef"}
	var r1, r2, r3 dedup.ClaimResult
	var found3 string
	var held bool
	var e1, e2, e3, e4 error
	wg.Go(func() { r1, _, e1 = s.Claim(ctx, "s-new", "A", time.Minute) })
	wg.Go(func() { r2, _, e2 = s.Claim(ctx, "s-new", "B", time.Minute) })
	wg.Go(func() { r3, found3, e3 = s.Claim(ctx, "s-done", "B", time.Minute) })
	wg.Go(func() { held, e4 = s.Commit(ctx, "s-done", "A", rec, time.Hour) })
	g.queued(t, 4)
	g.open()
	wg.Wait()
	for _, err := range []error{e1, e2, e3, e4} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if (r1 != dedup.Claimed || r2 != dedup.InFlight) && (r1 != dedup.InFlight || r2 != dedup.Claimed) {
		t.Fatalf("two claims of a new key in one group = %v, %v; want one claimed, one in flight", r1, r2)
	}
	if !held {
		t.Fatal("the commit beside a claim of its key did not hold its lease")
	}
	if r3 != dedup.AlreadyDone || found3 != rec.Encode() {
		t.Fatalf("the claim beside the commit of its key = %v %q; want done %q", r3, found3, rec.Encode())
	}
	if n := s.db.group.reran.Load(); n != 0 {
		t.Fatalf("%d groups rolled back; want none", n)
	}
}

// refused tells a statement the server refused from a session or a
// connection that ended, whatever the language of the server's messages.
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "22021"}, true},
		{&pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "40P01"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ERREUR", SeverityUnlocalized: "ERROR"}), true},
		{&pgconn.PgError{Severity: "ERROR", Code: "08P01"}, true}, // PgBouncer's own: no V field
		{&pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "SCHWERWIEGEND", SeverityUnlocalized: "FATAL"}, false},
		{context.DeadlineExceeded, false},
		{errors.New("unexpected EOF"), false},
	} {
		if got := refused(c.err); got != c.want {
			t.Errorf("refused(%v) = %v; want %v", c.err, got, c.want)
		}
	}
}

// Claims of the same keys racing from many goroutines, in many orders,
// grouped: each key is claimed exactly once, its commit lands once, and
// no statement fails (two groups never deadlock).
func TestGroupedClaimsRace(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", "8", "cleanup_interval", "1h"))
	// Each worker waits a moment once it took a group's first statement,
	// so that others queue behind it and groups form even on a loaded
	// machine, where every statement could otherwise be taken alone (CI
	// run 66: "60 transactions wrote the 60 records").
	s.db.group.took = func() { time.Sleep(2 * time.Millisecond) }
	ctx := context.Background()
	const goroutines, keys = 24, 60
	var mu sync.Mutex
	winner := map[string]string{}
	var wg sync.WaitGroup
	for gi := range goroutines {
		order := rand.Perm(keys)
		wg.Go(func() {
			tok := fmt.Sprintf("tok%d", gi)
			for _, k := range order {
				key := fmt.Sprintf("r-%02d", k)
				res, _, err := s.Claim(ctx, key, tok, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if res != dedup.Claimed {
					continue
				}
				mu.Lock()
				if w, ok := winner[key]; ok {
					t.Errorf("%s claimed by %s and %s", key, w, tok)
				}
				winner[key] = tok
				mu.Unlock()
				rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "t", Fingerprint: "x0123456789abcdef", EventID: tok}
				if held, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil || !held {
					t.Errorf("commit of %s = %v, %v", key, held, err)
				}
			}
		})
	}
	wg.Wait()
	if len(winner) != keys {
		t.Fatalf("%d keys claimed; want %d", len(winner), keys)
	}
	var b strings.Builder
	for k := range keys {
		key := fmt.Sprintf("r-%02d", k)
		fmt.Fprintf(&b, "%s=%s,", key, winner[key])
	}
	got := srv.Psql(t, `SELECT string_agg(event_id || '=' || message_event_id, ',' ORDER BY event_id) || ',' FROM `+table+` WHERE event_id LIKE 'r-%' AND lease_token IS NULL`)
	if got != b.String() {
		t.Fatalf("done records: %s\nwant each key's winner: %s", got, b.String())
	}
	// No group was rolled back (a deadlock between two groups would
	// be), and groups formed: fewer transactions wrote the records than
	// there are records.
	if n := s.db.group.reran.Load(); n != 0 {
		t.Fatalf("%d groups rolled back and run alone; want none", n)
	}
	if n, _ := strconv.Atoi(srv.Psql(t, `SELECT count(DISTINCT xmin::text) FROM `+table+` WHERE event_id LIKE 'r-%'`)); n >= keys {
		t.Fatalf("%d transactions wrote the %d records: no group formed", n, keys)
	}
}

// Two groups that insert the same two keys, each pausing between them:
// each writes them in the keys' order, so the second waits for the
// first instead of both waiting for each other (a deadlock, which the
// server would end by refusing one group after deadlock_timeout).
func TestGroupsDoNotDeadlock(t *testing.T) {
	srv := pgtest.Start(t)
	table := uniqueTable()
	s, _ := provision(t, storeJSON(srv.DSN, table, "max_conns", "4", "cleanup_interval", "1h"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := s.Claim(ctx, "warm", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	op := func(key, sql string, args ...any) *groupOp {
		return &groupOp{ctx: ctx, key: key, sql: sql, args: args, query: true, res: make(chan groupResult, 1)}
	}
	insert := func(key, tok string) *groupOp { return op(key, s.db.sql.insert, key, tok, int64(6e7)) }
	pause := op("d-15", `SELECT true FROM pg_sleep(0.3)`)
	pause2 := op("d-15", `SELECT true FROM pg_sleep(0.3)`)
	// given in opposite orders; "d-15" sorts between the two keys
	a := []*groupOp{insert("d-2", "A"), pause, insert("d-1", "A")}
	b := []*groupOp{insert("d-1", "B"), pause2, insert("d-2", "B")}
	var wg sync.WaitGroup
	wg.Go(func() { s.db.group.send(a) })
	wg.Go(func() { s.db.group.send(b) })
	wg.Wait()
	inserted := map[string]string{}
	for _, group := range [][]*groupOp{a, b} {
		for _, o := range group {
			r := <-o.res
			if r.err != nil || r.alone {
				t.Fatalf("%s: %+v; want an answer from its group", o.key, r)
			}
			if o.sql == s.db.sql.insert && r.changed {
				inserted[o.key] += o.args[1].(string)
			}
		}
	}
	if n := s.db.group.reran.Load(); n != 0 {
		t.Fatalf("%d groups rolled back (a deadlock); want none", n)
	}
	if inserted["d-1"] == "" || inserted["d-1"] != inserted["d-2"] || len(inserted["d-1"]) != 1 {
		t.Fatalf("inserted by: %v; want both keys by the same one group", inserted)
	}
}
