package postgres

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Group commit. A new event's claim (the insert) and the commit of a
// held lease are the two statements every processed event costs, each
// a transaction that PostgreSQL flushes to its WAL before it answers.
// Those that wait at the same moment (deliveries in flight together;
// every claim's insert, a duplicate's included, which changes nothing)
// are sent together: one pipeline of the same statements, one round
// trip, which PostgreSQL runs as one implicit transaction with one
// commit (pgx's Batch: the statements, then a single Sync). Each
// statement keeps its own meaning (the primary key still admits one
// insert of a key, the commit still checks the token and the lease's
// time), and nobody is answered before the group's commit: a statement
// answered "inserted" or "updated" is durable with the others.
//
// A delivery that arrives alone is sent alone at once: a group is what
// waited while the workers were busy, never a timer. Every other
// statement (a duplicate's second one, a commit's second one, renew,
// release, forget, the sweep) runs alone as before.

// maxGroup bounds the statements of one group.
const maxGroup = 64

// groupWorkers is how many groups may be in flight at once: half of the
// pool (the fewer the workers, the larger the groups under load), the
// rest left to the statements that run alone.
func groupWorkers(maxConns int32) int {
	return max(1, int(maxConns)/2)
}

// groupOp is one statement waiting for its group.
type groupOp struct {
	ctx   context.Context // the delivery's: a statement whose caller gave up is not sent
	key   string
	sql   string
	args  []any
	query bool // the statement returns a row when it changed one (RETURNING); else its tag counts
	res   chan groupResult
}

type groupResult struct {
	changed bool  // the statement inserted or updated its row
	alone   bool  // not sent: the caller runs the statement alone
	err     error // the outcome is unknown (the connection, a timeout) or the statement failed alone
}

// grouper collects statements into groups and sends them.
type grouper struct {
	db   *sharedDB
	q    chan *groupOp
	wg   sync.WaitGroup
	took func() // tests: called when a worker took a group's first statement

	reran atomic.Int64 // groups the server refused, whose statements then ran alone
}

func newGrouper(db *sharedDB) *grouper {
	g := &grouper{db: db, q: make(chan *groupOp, maxGroup)}
	for range groupWorkers(db.opts.config.MaxConns) {
		g.wg.Add(1)
		go g.work()
	}
	return g
}

// wait returns once every worker stopped (after db.stop was closed).
func (g *grouper) wait() { g.wg.Wait() }

// exec runs one insert … RETURNING (query) or one update in the next
// group, or alone when the group cannot take it; changed is whether it
// inserted or updated its row.
func (g *grouper) exec(ctx context.Context, key, sql string, query bool, args ...any) (changed bool, err error) {
	var ok bool
	op := &groupOp{ctx: ctx, key: key, sql: sql, args: args, query: query, res: make(chan groupResult, 1)}
	select {
	case g.q <- op:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-g.db.stop:
		return false, errPoolClosed
	}
	// Once taken, a statement is answered: with its group's outcome, or
	// errPoolClosed by a worker that stops (the caller's time, from
	// Store.op, bounds the wait for one queued as the workers stopped).
	var r groupResult
	select {
	case r = <-op.res:
	case <-ctx.Done():
		if r, ok = answered(op); !ok {
			return false, ctx.Err()
		}
	}
	if !r.alone {
		return r.changed, r.err
	}
	return g.db.alone(ctx, op)
}

// answered is op's answer if it came at the same moment as the end of
// its caller's wait: an answer known is never turned into an error.
func answered(op *groupOp) (groupResult, bool) {
	select {
	case r := <-op.res:
		return r, true
	default:
		return groupResult{}, false
	}
}

// alone runs op's statement on its own, in its caller's time.
func (db *sharedDB) alone(ctx context.Context, op *groupOp) (bool, error) {
	changed, err := runBatch(ctx, db.pool, []*groupOp{op})
	return changed[0], err
}

// batchSender sends a pgx Batch: the pool (a statement alone) or one of
// its connections (a group).
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// runBatch sends ops' statements through s as one pipeline, one
// implicit transaction, and returns whether each inserted or updated its
// row; err is the first statement's or the commit's (Close reads up to
// the Sync's answer). With an error, changed says nothing: the
// transaction did not commit, or its outcome is unknown.
func runBatch(ctx context.Context, s batchSender, ops []*groupOp) (changed []bool, err error) {
	var b pgx.Batch
	for _, op := range ops {
		b.Queue(op.sql, op.args...)
	}
	changed = make([]bool, len(ops))
	br := s.SendBatch(ctx, &b)
	for i, op := range ops {
		var e error
		if op.query {
			var v bool
			if e = br.QueryRow().Scan(&v); errors.Is(e, pgx.ErrNoRows) {
				e = nil
			}
			changed[i] = e == nil && v
		} else {
			var tag pgconn.CommandTag
			tag, e = br.Exec()
			changed[i] = e == nil && tag.RowsAffected() == 1
		}
		if err == nil {
			err = e
		}
	}
	if e := br.Close(); err == nil {
		err = e
	}
	if err != nil {
		clear(changed)
	}
	return changed, err
}

func (g *grouper) work() {
	defer g.wg.Done()
	for {
		var first *groupOp
		select {
		case first = <-g.q:
		case <-g.db.stop:
			// The group under way, if any, finished with its answers;
			// what still waits is not sent.
			for {
				select {
				case op := <-g.q:
					op.res <- groupResult{err: errPoolClosed}
				default:
					return
				}
			}
		}
		if g.took != nil {
			g.took()
		}
		// Two statements on one key in a group (a redelivery racing its
		// first delivery) need nothing more: the second meets the first's
		// row as a statement after it in the same transaction.
		ops := []*groupOp{first}
	fill:
		for len(ops) < maxGroup {
			select {
			case op := <-g.q:
				ops = append(ops, op)
			default:
				break fill
			}
		}
		g.send(ops)
	}
}

// send runs ops as one pipeline, one transaction, and answers each once
// the transaction committed.
func (g *grouper) send(ops []*groupOp) {
	// The group's time: the latest of its callers' deadlines (each has
	// the store's statement_timeout from its start), so that no
	// statement runs on after every caller's time ran out.
	deadline := time.Now().Add(g.db.opts.timeout)
	if d, ok := latest(ops); ok {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	conn, err := g.db.pool.Acquire(ctx)
	if err != nil {
		// Nothing was sent: each runs alone, in its caller's time.
		for _, op := range ops {
			op.res <- groupResult{alone: true}
		}
		return
	}
	defer conn.Release()
	// Who gave up while the group waited for its connection is not sent,
	// and the group's time is that of those left.
	live := ops[:0]
	for _, op := range ops {
		if err := op.ctx.Err(); err != nil {
			op.res <- groupResult{err: err}
			continue
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	if d, ok := latest(live); ok {
		var cancelLive context.CancelFunc
		ctx, cancelLive = context.WithDeadline(ctx, d)
		defer cancelLive()
	}
	// One order of keys in every group: two groups that write the same
	// rows take their locks in the same order, so neither can wait for
	// the other while holding what the other waits for (a deadlock).
	slices.SortFunc(live, func(a, b *groupOp) int { return strings.Compare(a.key, b.key) })
	batch := live
	if lt, ok := lockTimeout(ctx, live); ok && len(live) > 1 {
		batch = append([]*groupOp{lt}, live...)
	}
	changed, err := runBatch(ctx, conn, batch)
	switch {
	case err == nil:
		changed = changed[len(batch)-len(live):]
		for i, op := range live {
			op.res <- groupResult{changed: changed[i]}
		}
	case len(live) > 1 && refused(err):
		// The server refused a statement (a value it cannot store, a
		// lock or a statement_timeout it gave up on) and rolled the
		// whole group back: none of it was committed. Each runs alone,
		// so that one bad statement fails its own delivery only.
		g.reran.Add(1)
		for _, op := range live {
			op.res <- groupResult{alone: true}
		}
	default:
		// The connection or Caddy's time ran out, or the server ended
		// the session (FATAL): the commit may or may not have happened,
		// as for a statement alone whose answer is lost.
		for _, op := range live {
			op.res <- groupResult{err: err}
		}
	}
}

// lockTimeout is the statement that opens a group of several: the
// server's lock_timeout for the group's transaction (SET LOCAL, through
// set_config, which a pipeline's implicit transaction and PgBouncer's
// transaction mode both take), half the time its earliest caller has
// left, or the lock_timeout the session has if that is shorter (an
// operator's, in the DSN or set on the role or database). A
// statement that waits that long for a row lock another transaction
// holds (an operator's open transaction, a stuck session; a group of
// another instance holds its rows for milliseconds) is refused by the
// server while the group still has time, and the group's statements run
// alone, so that only the one that waits fails its delivery. Without
// it, Caddy's deadline for the group ended first and every delivery in
// the group got the store error.
// A caller with too little time for a millisecond's half is left out
// (it fails on its own time whatever the group does); the limit is at
// most the largest PostgreSQL takes.
func lockTimeout(ctx context.Context, ops []*groupOp) (*groupOp, bool) {
	var half time.Duration
	consider := func(d time.Time, has bool) {
		if h := time.Until(d) / 2; has && h >= time.Millisecond && (half == 0 || h < half) {
			half = h
		}
	}
	consider(ctx.Deadline())
	for _, op := range ops {
		consider(op.ctx.Deadline())
	}
	if half == 0 {
		return nil, false
	}
	return &groupOp{sql: setLockTimeout, args: []any{min(half.Milliseconds(), math.MaxInt32)}, query: true}, true
}

// setLockTimeout sets lock_timeout for the transaction to $1
// milliseconds, unless the session's is shorter (0 is none).
const setLockTimeout = `SELECT set_config('lock_timeout', (CASE WHEN c > 0 AND c < $1 THEN c ELSE $1 END)::bigint || 'ms', true) <> ''
FROM (SELECT extract(epoch FROM current_setting('lock_timeout')::interval) * 1000 AS c) AS s`

// latest is the latest deadline of ops' callers, if they all have one.
func latest(ops []*groupOp) (time.Time, bool) {
	var last time.Time
	for _, op := range ops {
		d, ok := op.ctx.Deadline()
		if !ok {
			return time.Time{}, false
		}
		if d.After(last) {
			last = d
		}
	}
	return last, true
}

// refused is whether err is the server's refusal of one statement (an
// ERROR: the transaction rolled back, the session goes on), not the end
// of the session (FATAL, PANIC) or of the connection. The severity as
// the server spells it whatever its lc_messages (V, PostgreSQL 9.6 and
// later), else as it sent it (S: PgBouncer's own errors).
func refused(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	sev := pg.SeverityUnlocalized
	if sev == "" {
		sev = pg.Severity
	}
	return sev == "ERROR"
}
