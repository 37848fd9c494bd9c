package postgres

import (
	"context"
	"hash/fnv"
	"time"

	"go.uber.org/zap"
)

// sweepBlocks is how many of the table's blocks (8 KiB each) one batch
// reads, some 800 rows at most: each batch is one short statement, its
// own transaction, so a sweep never holds many row locks or any lock on
// the table, and deliveries go on between batches. 64 blocks made the
// batches' p99 55 ms at 5 M rows on a loaded machine (bench/POSTGRES.md).
const sweepBlocks = 32

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

// sweep deletes expired rows in one pass over the table, a range of
// sweepBlocks blocks per batch from where the last sweep stopped, each
// batch one statement (its own transaction) that first takes a
// transaction-scoped advisory lock (pg_try_advisory_xact_lock): while another instance's
// batch holds it, this one stops, so one instance at a time sweeps the
// table. The lock ends with the batch's transaction, on the server
// connection that ran it: nothing to release, and behind a
// transaction-mode pooler (which may hand every transaction another
// server connection) no lock is left on an idle one. It reports how
// many rows it deleted and whether it swept (false: another instance
// held the lock at the first batch).
//
// There is no index on expires_at (it would make every commit write an
// index entry, see statements.ddl): a batch reads its blocks by a TID
// range scan, which costs the same whatever the table's size and
// statistics, and a pass reads the whole table once.
func (db *sharedDB) sweep(ctx context.Context) (deleted int64, swept bool, err error) {
	key := db.lockKey()
	var end int64
	if err := db.pool.QueryRow(ctx, db.sql.blocks).Scan(&end); err != nil {
		return 0, false, err
	}
	for {
		from := db.sweepAt.Load()
		if from >= end {
			db.sweepAt.Store(0) // the next sweep starts a new pass
			return deleted, swept, nil
		}
		n, got, err := db.sweepBatch(ctx, key, from, from+sweepBlocks)
		swept = swept || got
		if !got || err != nil {
			return deleted, swept, err
		}
		deleted += n
		db.sweepAt.Store(from + sweepBlocks)
		if ctx.Err() != nil {
			return deleted, true, ctx.Err()
		}
	}
}

// sweepBatch deletes the expired rows of the blocks [from, to) under
// the sweep's lock, in one statement (its own transaction, one round
// trip); got is false when another instance holds the lock.
func (db *sharedDB) sweepBatch(ctx context.Context, key, from, to int64) (n int64, got bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, db.opts.timeout)
	defer cancel()
	if err := db.pool.QueryRow(ctx, db.sql.sweep, from, to, key).Scan(&got, &n); err != nil {
		return 0, false, err
	}
	return n, got, nil
}
