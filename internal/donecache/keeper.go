package donecache

import (
	"context"
	"sync/atomic"
	"time"
)

// Hooks are what a store says about its cache's connection. All are
// optional; they are called from the Keeper's goroutine only.
type Hooks struct {
	// Off is a failure of the connection, called once per distinct
	// failure until the cache is served again (for the log).
	Off func(err error)
	// On is called when the cache is served again after an Off.
	On func()
	// Gauge is called with each change of whether the cache is off (not
	// served): true from the start until the first Up and after each
	// loss, false again at Close (a closed cache is not counted).
	Gauge func(off bool)
	// Wait, when it returns more than zero, is the wait before the next
	// try after err, instead of the back-off (e.g. until an ACL changes).
	Wait func(err error) time.Duration
}

// MaxBackoff caps the wait between tries after a failure; the first
// retry comes after 100 ms.
const MaxBackoff = 5 * time.Second

// Keeper runs the connection that keeps a cache true: session after
// session, with back-off, the cache emptied and not served between them.
type Keeper struct {
	cache   *Cache
	session func(ctx context.Context, k *Keeper) error
	hooks   Hooks
	stop    chan struct{}
	stopped chan struct{}
	conns   atomic.Int64 // sessions that called Up

	off       bool // as last given to Gauge (the Keeper's goroutine)
	loggedOff bool
}

// Keep starts running session for c until Close. session connects,
// calls k.Up once the connection hears of every change, applies what it
// hears, and returns when the connection fails or ctx ends (ctx ends at
// Close; its error is then ignored).
func Keep(c *Cache, session func(ctx context.Context, k *Keeper) error, h Hooks) *Keeper {
	k := &Keeper{cache: c, session: session, hooks: h, stop: make(chan struct{}), stopped: make(chan struct{})}
	go k.run()
	return k
}

// Close stops the Keeper and waits for it (bounded by the session's own
// timeouts).
func (k *Keeper) Close() {
	close(k.stop)
	<-k.stopped
}

// Conns is the number of sessions that reached Up, for tests.
func (k *Keeper) Conns() int64 { return k.conns.Load() }

// Cache is the cache kept.
func (k *Keeper) Cache() *Cache { return k.cache }

// Up tells that the session's connection now hears of every change: the
// cache, emptied of what it may have missed, is served from now on.
// Call it from the session only.
func (k *Keeper) Up() {
	k.conns.Add(1)
	k.cache.up()
	k.setOff(false)
	if k.loggedOff {
		k.loggedOff = false
		if k.hooks.On != nil {
			k.hooks.On()
		}
	}
}

func (k *Keeper) setOff(off bool) {
	if off != k.off {
		k.off = off
		if k.hooks.Gauge != nil {
			k.hooks.Gauge(off)
		}
	}
}

func (k *Keeper) run() {
	defer close(k.stopped)
	k.setOff(true) // until the first session is up
	defer k.setOff(false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-k.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := 100 * time.Millisecond
	lastErr := "" // the failure last logged, logged once until the cache is served again
	for {
		established := k.conns.Load()
		err := k.session(ctx, k)
		k.cache.Down()
		k.setOff(true)
		if ctx.Err() != nil {
			return
		}
		if k.conns.Load() > established {
			// It was up: a new loss is worth a log line, and a prompt
			// reconnection.
			lastErr, backoff = "", 100*time.Millisecond
		}
		if err != nil && err.Error() != lastErr {
			lastErr, k.loggedOff = err.Error(), true
			if k.hooks.Off != nil {
				k.hooks.Off(err)
			}
		}
		wait := backoff
		if k.hooks.Wait != nil && err != nil {
			if w := k.hooks.Wait(err); w > 0 {
				wait = w
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, MaxBackoff)
	}
}
