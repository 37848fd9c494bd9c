package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/internal/firstcheck"
	"github.com/sangho/caddy-sangho-dedup/internal/promreg"
)

// checkRetryEvery is how long a failed table check is remembered before
// a request runs it again.
const checkRetryEvery = time.Second

// Problems counted by caddy_sangho_dedup_postgres_problems_total, one
// per log line.
const (
	problemPermission = "permission_missing"
	problemTable      = "table_missing"
)

var problems = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "sangho_dedup", Name: "postgres_problems_total",
	Help: "Problems of the postgres store's database that keep it from answering, by kind (permission_missing, table_missing); each is also an error log line.",
}, []string{"problem"})

func init() {
	for _, p := range []string{problemPermission, problemTable} {
		problems.WithLabelValues(p) // exported at 0, so that a first one is an increase
	}
}

// registerMetrics adds the store's collectors to a config's registry.
func registerMetrics(reg prometheus.Registerer) error {
	return promreg.Register(reg, problems)
}

// tableCheck makes sure, once per shared pool, that the table exists
// (creating it if create_table is on) and that the role holds every
// privilege the store uses, one check at a time; a failure is remembered
// for checkRetryEvery, so a missing grant costs the server one check a
// second, not one per request. A statement refused for lack of a
// privilege or of the table (a grant revoked, the table dropped) makes
// the next request check again.
type tableCheck struct {
	db     *sharedDB
	ok     atomic.Bool // the table and privileges are known to be there
	flight firstcheck.Flight
}

func newTableCheck(db *sharedDB) *tableCheck { return &tableCheck{db: db} }

// problemError is a missing privilege or table: the store cannot
// answer until an operator fixes it.
type problemError struct {
	problem   string // problemPermission or problemTable
	privilege string // e.g. "INSERT", "USAGE on schema app", "CREATE on schema public"
	table     string
	err       error // the server's refusal, if any
}

func (e *problemError) Error() string {
	if e.problem == problemTable {
		return fmt.Sprintf("postgres store: table %s does not exist and create_table is off: create it with the DDL of docs/postgres.md", e.table)
	}
	msg := fmt.Sprintf("postgres store: the database role lacks %s on %s", e.privilege, e.table)
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *problemError) Unwrap() error { return e.err }

func (c *tableCheck) ensure(ctx context.Context, logger *zap.Logger) error {
	return c.flight.Ensure(ctx, &c.ok, checkRetryEvery, func(ctx context.Context) (bool, error) {
		err := c.run(ctx, logger)
		if err != nil && c.db.startupTimeoutRefused(err, logger) {
			err = c.run(ctx, logger) // the first connection, without statement_timeout
		}
		var pe *problemError
		if errors.As(err, &pe) {
			c.log(pe, logger)
		}
		return pe != nil, c.db.opts.scrub(err)
	})
}

func (c *tableCheck) log(pe *problemError, logger *zap.Logger) {
	if logger == nil {
		return
	}
	problems.WithLabelValues(pe.problem).Inc()
	if pe.problem == problemTable {
		logger.Error("postgres table missing", zap.String("table", pe.table),
			zap.Bool("create_table", false), zap.Int("status", 503),
			zap.String("fix", "create it with the DDL of docs/postgres.md, or create_table on"))
		return
	}
	fields := []zap.Field{zap.String("privilege", pe.privilege), zap.String("table", pe.table)}
	if pe.err != nil {
		fields = append(fields, zap.Error(c.db.opts.scrub(pe.err)))
	}
	fields = append(fields, zap.Int("status", 503), zap.String("fix", "grant it: the GRANT lines of docs/postgres.md"))
	logger.Error("postgres permission missing", fields...)
}

// failed turns an operation's error into the store's. A statement
// refused for lack of a privilege or of the table runs the check again
// at once (at most once per checkRetryEvery, as at start), so that the
// error and the log line name what is missing ("UPDATE"), not only that
// something is.
func (c *tableCheck) failed(ctx context.Context, err error, logger *zap.Logger) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || (pg.Code != "42501" && pg.Code != "42P01") {
		return c.db.opts.scrub(fmt.Errorf("postgres store: %w", err))
	}
	qualified := c.db.opts.qualified()
	c.ok.Store(false)
	if pg.Code == "42P01" && c.db.opts.create {
		// recreated by the next check
		return c.db.opts.scrub(fmt.Errorf("postgres store: table %s vanished: %w", qualified, err))
	}
	cerr := c.ensure(ctx, logger)
	var pe *problemError
	switch {
	case errors.As(cerr, &pe):
		return cerr // named, and logged by the check
	case cerr != nil:
		// the check could not run (e.g. the request's time is up): the
		// next request runs it and logs what is missing
		return c.db.opts.scrub(fmt.Errorf("postgres store: %w", err))
	case pg.Code == "42P01":
		// created again meanwhile
		return c.db.opts.scrub(fmt.Errorf("postgres store: %w", err))
	}
	// The check finds every privilege it knows: the refusal is one it
	// cannot see (a column privilege, a row security policy), or the
	// privilege was granted again meanwhile.
	pe = &problemError{problem: problemPermission, table: qualified, err: err,
		privilege: "a privilege the check does not see (the role holds SELECT, INSERT, UPDATE and DELETE on the table: a column privilege or a row security policy?)"}
	c.log(pe, logger)
	return c.db.opts.scrub(pe)
}

// run checks the schema's USAGE, the table (creating it when allowed)
// and the table privileges.
func (c *tableCheck) run(ctx context.Context, logger *zap.Logger) error {
	o := c.db.opts
	qualified := o.qualified()
	schema := o.schema
	var exists bool
	if schema != "" {
		var usage *bool
		// NULL: no such schema (then the table is missing too)
		if err := c.db.pool.QueryRow(ctx,
			`SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1`, schema,
		).Scan(&usage); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("postgres store: checking schema %s: %w", schema, err)
		}
		if usage != nil && !*usage {
			return &problemError{problem: problemPermission, privilege: "USAGE on schema " + schema, table: qualified}
		}
	}
	if err := c.db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, qualified).Scan(&exists); err != nil {
		return fmt.Errorf("postgres store: checking table %s: %w", qualified, err)
	}
	if !exists {
		if !o.create {
			return &problemError{problem: problemTable, table: qualified}
		}
		if err := c.create(ctx); err != nil {
			var pg *pgconn.PgError
			if errors.As(err, &pg) && pg.Code == "42501" {
				s := schema
				if s == "" {
					s = "the current schema (public)"
				}
				return &problemError{problem: problemPermission, privilege: "CREATE on schema " + s, table: qualified, err: err}
			}
			return fmt.Errorf("postgres store: creating table %s: %w", qualified, err)
		}
		if logger != nil {
			logger.Info("postgres table created", zap.String("table", qualified))
		}
	}
	if exists {
		c.upgrade(ctx, logger)
	}
	var sel, ins, upd, del bool
	if err := c.db.pool.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT'), has_table_privilege($1, 'INSERT'),
  has_table_privilege($1, 'UPDATE'), has_table_privilege($1, 'DELETE')`, qualified).Scan(&sel, &ins, &upd, &del); err != nil {
		return fmt.Errorf("postgres store: checking the privileges on %s: %w", qualified, err)
	}
	var missing []string
	for _, p := range []struct {
		name string
		has  bool
	}{{"SELECT", sel}, {"INSERT", ins}, {"UPDATE", upd}, {"DELETE", del}} {
		if !p.has {
			missing = append(missing, p.name)
		}
	}
	if len(missing) > 0 {
		return &problemError{problem: problemPermission, privilege: strings.Join(missing, ", "), table: qualified}
	}
	c.checkSynchronousCommit(ctx, logger)
	return nil
}

// checkSynchronousCommit warns when the store's sessions commit with
// synchronous_commit off (the server's, the role's or the database's
// setting): the server then acknowledges commits that a crash of
// PostgreSQL loses. The store does not change it (remote_apply and
// remote_write, stronger, are the operator's to keep). A failure to ask
// is not a problem of the store's.
func (c *tableCheck) checkSynchronousCommit(ctx context.Context, logger *zap.Logger) {
	var v string
	if logger == nil || c.db.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v) != nil || v != "off" {
		return
	}
	logger.Warn("postgres synchronous_commit off",
		zap.String("table", c.db.opts.qualified()),
		zap.String("risk", "the server acknowledges commits that a crash of PostgreSQL loses: a done record gone, the sender's retry is processed again, unmarked"),
		zap.String("fix", "ALTER ROLE <the store's role> SET synchronous_commit = on (or synchronous_commit=on in the DSN, without a pooler in between)"))
}

// create runs the DDL in one transaction. CREATE TABLE IF NOT EXISTS is
// not safe against itself: two sessions that both see no table both
// create it, and the loser fails on the row type's name (42710) or the
// catalog's unique index (23505). So instances take a transaction-scoped
// advisory lock on the table's name first: the second one in waits,
// then finds the table. A creator outside that lock (another tool) is
// still met by the error codes that mean "created meanwhile".
func (c *tableCheck) create(ctx context.Context) error {
	tx, err := c.db.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, c.db.ddlLockKey()); err != nil {
		return err
	}
	for _, q := range c.db.sql.ddl {
		if _, err := tx.Exec(ctx, q); err != nil {
			var pg *pgconn.PgError
			if errors.As(err, &pg) && (pg.Code == "23505" || pg.Code == "42P07" || pg.Code == "42710") {
				// Created meanwhile outside the lock, or another object
				// (an enum, a domain) holds the name: only the table
				// being there now tells them apart.
				_ = tx.Rollback(ctx)
				var exists bool
				if qerr := c.db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.db.opts.qualified()).Scan(&exists); qerr == nil && exists {
					return nil
				}
			}
			return err
		}
	}
	return tx.Commit(ctx)
}

// upgrade brings a table of an earlier release to today's layout: its
// index on expires_at goes (every commit wrote an entry in it and so
// could not be a HOT update) and its pages keep room for the commits
// (fillfactor, for the pages written from now on). Both are done
// without a lock that holds deliveries (DROP INDEX CONCURRENTLY, and
// ALTER TABLE SET takes a lock that writes do not wait for), by every
// instance that finds the index, several at once included: the ones
// that lose the race find it gone. A role that does not own the table
// cannot do either; the store then works as before, its commits not
// HOT, and says so once in the log.
func (c *tableCheck) upgrade(ctx context.Context, logger *zap.Logger) {
	q := c.db.opts.qualified()
	idx := c.db.sql.oldIndex
	var old bool
	if err := c.db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass($1) AND indrelid = to_regclass($2))`, idx, q).Scan(&old); err != nil || !old {
		return
	}
	_, err := c.db.pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+idx)
	if err == nil {
		_, err = c.db.pool.Exec(ctx, `ALTER TABLE `+q+` SET (fillfactor = `+fillfactor+`)`)
	}
	if err != nil {
		if c.db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, idx).Scan(&old); old {
			return // another instance dropped it meanwhile
		}
		if logger != nil {
			logger.Warn("postgres table kept as an earlier release made it: its commits are not HOT updates; as the table's owner, run the upgrade of docs/postgres.md",
				zap.String("table", q), zap.Error(c.db.opts.scrub(err)))
		}
		return
	}
	if logger != nil {
		logger.Info("postgres table upgraded", zap.String("table", q), zap.String("dropped_index", idx), zap.String("fillfactor", fillfactor))
	}
}
