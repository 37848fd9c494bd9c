package postgres

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/internal/mono"
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

// doneCache holds done records this process read from the table, so that
// a redelivery of a processed event is answered without a round trip.
// Through the store a done record only changes by expiring (each entry
// keeps the row's expires_at) or by Forget, which notifies every
// instance on the table's channel (in its own transaction, so the
// notification leaves when the delete commits): the listener drops the
// entry when the notification arrives. Entries are served only while
// the listener's connection is up and answered its last heartbeat within
// staleness; when it is lost the cache is emptied, since notifications
// may have been missed. At most max entries; a full cache drops an
// arbitrary one.
type doneCache struct {
	max       int
	staleness time.Duration

	live  atomic.Bool
	heard atomic.Int64 // mono.Now() of the listener's last answer

	mu sync.RWMutex
	m  map[string]cacheEntry
	// gen counts invalidations: a claim that read a done record before
	// one does not cache it (the record it read may be the one deleted).
	gen uint64

	hits, invalidated atomic.Int64 // for tests
}

type cacheEntry struct {
	val     string
	expires time.Time
}

func newDoneCache(max int) *doneCache {
	return &doneCache{max: max, staleness: 3 * time.Second, m: map[string]cacheEntry{}}
}

// get returns the done record cached under ck.
func (c *doneCache) get(ck string) (string, bool) {
	if !c.live.Load() || time.Duration(mono.Now()-c.heard.Load()) > c.staleness {
		return "", false
	}
	c.mu.RLock()
	e, ok := c.m[ck]
	c.mu.RUnlock()
	if !ok || !time.Now().Before(e.expires) {
		return "", false
	}
	c.hits.Add(1)
	return e.val, true
}

// generation is the invalidation count, read before a claim is sent.
func (c *doneCache) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// put caches a done record that a claim sent at generation gen read.
func (c *doneCache) put(ck, val string, expires time.Time, gen uint64) {
	if !c.live.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if _, ok := c.m[ck]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[ck] = cacheEntry{val: val, expires: expires}
}

// invalidate drops ck ("*": everything) and keeps claims already sent
// from putting it back.
func (c *doneCache) invalidate(ck string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if ck == "*" {
		clear(c.m)
	} else {
		delete(c.m, ck)
	}
	c.invalidated.Add(1)
}

// listener keeps the connection that LISTENs on the forget channel,
// applies the notifications to the cache and sends a heartbeat every
// second; it reconnects after a failure, the cache emptied and not
// served meanwhile.
type listener struct {
	db      *sharedDB
	cache   *doneCache
	logger  *zap.Logger
	every   time.Duration
	stop    chan struct{}
	stopped chan struct{}
	conns   atomic.Int64 // sessions established, for tests
}

func newListener(db *sharedDB, cache *doneCache, logger *zap.Logger) *listener {
	l := &listener{db: db, cache: cache, logger: logger, every: time.Second,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	go l.run()
	return l
}

func (l *listener) close() {
	close(l.stop)
	<-l.stopped
}

func (l *listener) run() {
	defer close(l.stopped)
	backoff, lastErr := 100*time.Millisecond, ""
	for {
		established := l.conns.Load()
		err := l.session()
		l.cache.live.Store(false)
		l.cache.invalidate("*")
		select {
		case <-l.stop:
			return
		default:
		}
		if l.conns.Load() > established {
			lastErr, backoff = "", 100*time.Millisecond
		}
		if err != nil && err.Error() != lastErr {
			l.logger.Warn("postgres local_cache off", zap.Error(l.db.opts.scrub(err)))
			lastErr = err.Error()
		}
		select {
		case <-l.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// session runs one listening connection until it fails or the store
// stops.
func (l *listener) session() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
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
	l.conns.Add(1)
	l.cache.invalidate("*") // entries learned before LISTEN may have missed one
	l.cache.heard.Store(mono.Now())
	l.cache.live.Store(true)
	if l.conns.Load() > 1 {
		l.logger.Info("postgres local_cache on")
	}
	for {
		wctx, wcancel := context.WithTimeout(ctx, l.every)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		if ctx.Err() != nil {
			return nil
		}
		if n != nil {
			l.cache.invalidate(n.Payload)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// heartbeat: the connection still answers (get serves entries
		// only within staleness of the last answer)
		hctx, hcancel := context.WithTimeout(ctx, timeout)
		_, err = conn.Exec(hctx, "SELECT 1")
		hcancel()
		if err != nil {
			return err
		}
		l.cache.heard.Store(mono.Now())
	}
}
