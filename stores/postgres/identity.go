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
// key_prefix (dedup.StateSharer): the cluster's system identifier
// (initdb's, also its physical replicas'), the database the connection
// landed in and the schema-qualified table. However a DSN is spelled
// (host name or address, Unix socket, database left out, a pooler in
// between), one table is then one ID. The answer is kept for the pool's
// life, so a reload does not ask again.
//
// When the server cannot answer within identifyTimeout (down,
// unreachable, a refused login, a server without pg_control_system),
// the ID is the DSN's, spelled one way (options.stateID), a warning
// says so, and the next provision (a reload) asks again: one table
// reached through two unrelated host names is then two stores to the
// check until it can be asked.
func (db *sharedDB) identify(ctx caddy.Context, logger *zap.Logger) string {
	db.idMu.Lock()
	defer db.idMu.Unlock()
	if db.identity != "" {
		return db.identity
	}
	o := db.opts
	timeout := min(identifyTimeout, o.timeout)
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var system, database string
	err := db.pool.QueryRow(qctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).Scan(&system, &database)
	if err != nil {
		id := o.stateID()
		logger.Warn("postgres identity unknown", zap.String("compared_as", id),
			zap.String("risk", "another endpoint on this table through a DSN spelled otherwise goes unnoticed until a reload can ask the server"),
			zap.Error(o.scrub(err)))
		return id
	}
	db.identity = "postgres system_identifier " + system + " database " + database + " table " + o.schema + "." + o.table
	return db.identity
}
