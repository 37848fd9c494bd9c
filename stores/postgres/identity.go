package postgres

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// identifyTimeout bounds the question identify asks at provision (less
// if statement_timeout is shorter): Caddy starts while PostgreSQL is
// down or unreachable, at most this much later per pool.
const identifyTimeout = 2 * time.Second

// identify names the table as the server does, for the handler's check
// that two endpoints with different secrets do not share one table and
// key_prefix (dedup.DataSharer) and for the forget that stops commit
// retries: the cluster's system identifier (initdb's, also its physical
// replicas'), the database the connection landed in and the
// schema-qualified table. However a DSN is spelled (host name or
// address, Unix socket, database left out, a pooler in between), one
// table is then one ID.
//
// When the server cannot answer within identifyTimeout (down,
// unreachable, a refused login, a server without pg_control_system),
// the ID is the DSN's, spelled one way (options.stateID), and a warning
// says so: one table reached through two unrelated host names is then
// two stores to the check. The server's answer is kept for the pool's
// life, the DSN's stands for one config load (storepool.DataName).
func (db *sharedDB) identify(ctx caddy.Context, logger *zap.Logger) string {
	o := db.opts
	ask := func() (string, error) {
		qctx, cancel := context.WithTimeout(ctx, min(identifyTimeout, o.timeout))
		defer cancel()
		var system, database string
		query := func() error {
			return db.pool.QueryRow(qctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).Scan(&system, &database)
		}
		err := query()
		if err != nil && db.startupTimeoutRefused(err, logger) {
			err = query() // a pooler: without statement_timeout
		}
		if err != nil {
			return "", err
		}
		return "postgres system_identifier " + system + " database " + database + " table " + o.schema + "." + o.table, nil
	}
	return db.name.Of(ctx.Done(), o.stateID(), ask, func(err error) {
		logger.Warn("postgres identity unknown", zap.String("compared_as", o.stateID()),
			zap.String("risk", "another endpoint on this table through a DSN spelled otherwise goes unnoticed until a config load (a reload) while the server answers"),
			zap.Error(o.scrub(err)))
	})
}
