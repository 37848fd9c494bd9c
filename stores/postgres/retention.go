package postgres

import (
	"context"
	"hash/fnv"
	"time"

	"go.uber.org/zap"
)

// sweepBatch is how many expired rows one DELETE removes: each batch is
// its own short transaction, so a sweep never holds many row locks or
// any lock on the table, and deliveries go on between batches.
const sweepBatch = 1000

// sweepFor bounds one sweep; the next interval goes on where it stopped.
const sweepFor = 30 * time.Second

// lockKey is the advisory lock that lets one instance at a time sweep
// the table.
func (db *sharedDB) lockKey() int64 { return db.advisoryKey("sangho_dedup.sweep ") }

// ddlLockKey is the advisory lock that lets one instance at a time
// create the table.
func (db *sharedDB) ddlLockKey() int64 { return db.advisoryKey("sangho_dedup.ddl ") }

func (db *sharedDB) advisoryKey(purpose string) int64 {
	h := fnv.New64a()
	h.Write([]byte(purpose + db.opts.qualified()))
	return int64(h.Sum64())
}

func (db *sharedDB) sweeper(logger *zap.Logger) {
	defer close(db.done)
	t := time.NewTicker(db.opts.cleanup)
	defer t.Stop()
	for {
		select {
		case <-db.stop:
			return
		case <-t.C:
			if !db.check.ok.Load() {
				continue // the table is not known to be usable yet
			}
			ctx, cancel := context.WithTimeout(context.Background(), sweepFor)
			go func() { // stop a sweep under way with the pool
				select {
				case <-db.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			n, swept, err := db.sweep(ctx)
			cancel()
			switch {
			case err != nil && logger != nil:
				logger.Warn("postgres sweep failed", zap.String("table", db.opts.qualified()), zap.Int64("deleted", n), zap.Error(db.opts.scrub(err)))
			case swept && n > 0 && logger != nil:
				logger.Debug("postgres sweep", zap.String("table", db.opts.qualified()), zap.Int64("deleted", n))
			}
		}
	}
}

// sweep deletes expired rows in batches if no other instance is
// sweeping the table (pg_try_advisory_lock, held on one connection for
// the sweep); it reports how many it deleted and whether it swept.
func (db *sharedDB) sweep(ctx context.Context) (deleted int64, swept bool, err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Release()
	key := db.lockKey()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		return 0, false, err
	}
	if !got {
		return 0, false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), db.opts.timeout)
		defer cancel()
		if _, uerr := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, key); uerr != nil {
			// the session keeps the lock: close it so the server drops it
			_ = conn.Conn().Close(context.Background())
		}
	}()
	for {
		bctx, cancel := context.WithTimeout(ctx, db.opts.timeout)
		tag, err := conn.Exec(bctx, db.sql.sweep, sweepBatch)
		cancel()
		if err != nil {
			return deleted, true, err
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch || ctx.Err() != nil {
			return deleted, true, ctx.Err()
		}
	}
}
