package postgres

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/internal/donecache"
)

// forgetChannel is the channel on which Forget announces, with
// pg_notify, the key it deleted (md5 of the key, hex, so that any key
// fits the payload); "*" asks every cache to drop everything. NOTIFY is
// per database, and the channel's name holds a hash of the table.
func forgetChannel(table string) string {
	sum := md5.Sum([]byte(table))
	return "sangho_dedup_forget_" + hex.EncodeToString(sum[:8])
}

// cacheKey is a key as forget notifications name it.
func cacheKey(key string) string {
	sum := md5.Sum([]byte(key))
	return hex.EncodeToString(sum[:])
}

// The local cache of done records (internal/donecache) holds the done
// records this process read from the table, so that a redelivery of a
// processed event is answered without a round trip. Through the store a
// done record only changes by expiring (each entry keeps what was left
// of the row's expires_at when it was read, counted down on the
// monotonic clock) or by Forget, which notifies every instance on the
// table's channel (in its own transaction, so the notification leaves
// when the delete commits): the listener invalidates the entry when the
// notification arrives. Claims read on the pool's connections and
// notifications arrive on the listener's, in no order between them: a
// notification therefore invalidates with a new generation, and a claim
// that read before it does not cache what it read. Entries are served
// only while the listener's connection is up and answered its last
// heartbeat within donecache.Staleness; when it is lost the cache is
// emptied, since notifications may have been missed.

// doneCache is the local cache, as the store names it.
type doneCache = donecache.Cache

func newDoneCache(max int) *doneCache { return donecache.New(max) }

// expiresAt is the cache's expiry for a record whose row expires at
// the wall-clock time at (read with Caddy's clock now).
func expiresAt(c *doneCache, at time.Time) int64 {
	return donecache.ExpiresIn(c.Now(), time.Until(at))
}

// invalidate applies a notification's payload: a key's cacheKey, or
// "*" for everything.
func invalidate(c *doneCache, payload string) {
	if payload == "*" {
		c.Flush()
	} else {
		c.Invalidate(payload)
	}
}

// listener keeps the connection that LISTENs on the forget channel,
// applies the notifications to the cache and sends a heartbeat every
// second; it reconnects after a failure, the cache emptied and not
// served meanwhile (donecache.Keeper).
type listener struct {
	db     *sharedDB
	cache  *doneCache
	logger *zap.Logger
	every  time.Duration
	keeper *donecache.Keeper
}

func newListener(db *sharedDB, cache *doneCache, logger *zap.Logger) *listener {
	l := &listener{db: db, cache: cache, logger: logger, every: time.Second}
	l.keeper = donecache.Keep(cache, l.session, donecache.Hooks{
		Off: func(err error) { logger.Warn("postgres local_cache off", zap.Error(db.opts.scrub(err))) },
		On:  func() { logger.Info("postgres local_cache on") },
	})
	return l
}

func (l *listener) close() { l.keeper.Close() }

// conns is the number of listening sessions established, for tests.
func (l *listener) conns() int64 { return l.keeper.Conns() }

// session runs one listening connection until it fails or ctx ends.
func (l *listener) session(ctx context.Context, k *donecache.Keeper) error {
	timeout := l.db.opts.timeout
	cctx, ccancel := context.WithTimeout(ctx, timeout)
	cc := l.db.opts.config.ConnConfig.Copy()
	_ = l.db.beforeConnect(cctx, cc)
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil && l.db.startupTimeoutRefused(err, l.logger) {
		cc = l.db.opts.config.ConnConfig.Copy()
		_ = l.db.beforeConnect(cctx, cc)
		conn, err = pgx.ConnectConfig(cctx, cc)
	}
	if err == nil {
		_, err = conn.Exec(cctx, "LISTEN "+pgx.Identifier{forgetChannel(l.db.opts.qualified())}.Sanitize())
	}
	ccancel()
	if conn != nil {
		defer conn.Close(context.Background())
	}
	if err != nil {
		return err
	}
	k.Up() // empties the cache: entries learned before LISTEN may have missed a notification
	for {
		wctx, wcancel := context.WithTimeout(ctx, l.every)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		if ctx.Err() != nil {
			return nil
		}
		if n != nil {
			invalidate(l.cache, n.Payload)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// heartbeat: the connection still answers (Get serves entries
		// only within staleness of the last answer)
		hctx, hcancel := context.WithTimeout(ctx, timeout)
		_, err = conn.Exec(hctx, "SELECT 1")
		hcancel()
		if err != nil {
			return err
		}
		l.cache.Heard()
	}
}
