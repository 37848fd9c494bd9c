package postgres

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// The store sends statement_timeout as a startup parameter, so that the
// server bounds every statement. A connection pooler may refuse it:
// PgBouncer answers any startup parameter it does not track with
// "unsupported startup parameter" (08P01) and closes the connection. On
// that answer the store connects without it from then on and says so
// once; Caddy still bounds every statement (it cancels one that runs
// past statement_timeout).

// beforeConnect leaves statement_timeout out of the startup once a
// server refused it.
func (db *sharedDB) beforeConnect(_ context.Context, cc *pgx.ConnConfig) error {
	if db.noStartupTimeout.Load() {
		delete(cc.RuntimeParams, "statement_timeout")
	}
	return nil
}

// startupTimeoutRefused reports whether err is a server's refusal of the
// statement_timeout startup parameter; the first one turns the parameter
// off for every later connection and is logged.
func (db *sharedDB) startupTimeoutRefused(err error, logger *zap.Logger) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "08P01" || !strings.Contains(pg.Message, "statement_timeout") {
		return false
	}
	if !db.noStartupTimeout.Swap(true) && logger != nil {
		logger.Info("postgres statement_timeout not sent",
			zap.String("reason", "the server refused it as a startup parameter (a connection pooler such as PgBouncer)"),
			zap.Duration("statement_timeout", db.opts.timeout),
			zap.String("effect", "Caddy still cancels a statement that runs longer; for the server to bound it too, ALTER ROLE <role> SET statement_timeout (docs/postgres.md)"))
	}
	return true
}
