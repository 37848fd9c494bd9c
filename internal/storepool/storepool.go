// Package storepool shares store resources (a Redis client, an open
// file, the memory map, a PostgreSQL pool) across config reloads, and
// keeps them for the deliveries a cleaned-up config still has in flight.
package storepool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Pool holds the shared resources, by key, for the whole process.
var Pool = &UsagePool{UsagePool: caddy.NewUsagePool(), closing: map[any]chan struct{}{}}

// UsagePool is Caddy's usage pool, except that a resource is not
// created again while the one it replaces is still being closed. The
// last Delete of a key takes it out of the pool, then closes it
// (Destruct): a config loaded meanwhile with the same settings (a reload
// back to them, as the old config's last delivery ends) opened a second
// one beside it, and a file, which one process opens once (it locks
// it), failed the reload ("in use by another process").
type UsagePool struct {
	*caddy.UsagePool
	mu      sync.Mutex
	closing map[any]chan struct{} // the keys a Delete is at, closed when it returns
}

// LoadOrNew is caddy.UsagePool's, after any Delete of key under way.
func (p *UsagePool) LoadOrNew(key any, construct caddy.Constructor) (value any, loaded bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch := p.closing[key]; ch != nil; ch = p.closing[key] {
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
	return p.UsagePool.LoadOrNew(key, construct)
}

// Delete is caddy.UsagePool's; LoadOrNew of key waits until it returns.
func (p *UsagePool) Delete(key any) (deleted bool, err error) {
	p.mu.Lock()
	for ch := p.closing[key]; ch != nil; ch = p.closing[key] {
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
	ch := make(chan struct{})
	p.closing[key] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.closing, key)
		p.mu.Unlock()
		close(ch)
	}()
	return p.UsagePool.Delete(key)
}

// Users counts the deliveries and commit retries that may still need a
// resource shared through Pool; a store embeds a *Users (set in
// Provision, tagged json:"-") to implement dedup.UseCounter with its
// Enter and Leave. On a reload Caddy starts the new config, then cleans
// the old one up without waiting for its requests in flight: Release
// keeps the resource until they are done, for at most dedup.DrainFor,
// and on a reload for at least DefaultReloadLinger.
type Users struct {
	// n counts the uses; releasedAtOnce is set in it when Release gives
	// the resource up: at once if it found none, else once the last use
	// left (or at the deadline).
	n  atomic.Int64
	mu sync.Mutex // orders the Releases
	// releasing: a Release waits in the background for the uses to leave.
	releasing bool
}

const releasedAtOnce = 1 << 62

// Enter marks the resource as in use (dedup.UseCounter). On a nil Users
// (a store that shares nothing, e.g. one provisioned for caddy
// validate) it does nothing.
func (u *Users) Enter() {
	if u != nil {
		u.n.Add(1)
	}
}

// Leave undoes one Enter (dedup.UseCounter); on a nil Users it does nothing.
func (u *Users) Leave() {
	if u != nil {
		u.n.Add(-1)
	}
}

// ErrUnloaded is the error of a claim refused because Closed: the
// delivery reached a config that a reload had unloaded (see Closed).
var ErrUnloaded = errors.New("the delivery reached a config a reload had unloaded, after its linger: claim refused (the sender's retry reaches the running config)")

// Closed reports whether Release gave the resource up before the use
// that asks entered: one that enters before keeps the resource open, one
// that enters after it (a request that reached the handler after Caddy
// cleaned its config up, and after the linger) must not claim an event
// on it, since its commit could not land. That holds also where another
// config still holds the resource: it counts no use for this one, and
// its own Release would close the resource under it. Call it after
// Enter.
func (u *Users) Closed() bool {
	return u != nil && u.n.Load()&releasedAtOnce != 0
}

// DefaultReloadLinger is how long a resource is kept after a reload
// cleaned up the config that used it, even with no use counted: Caddy
// cleans the old config up once its servers' shutdowns have started,
// and a request such a server read just before (still in a handler
// before sangho_dedup: forward_auth, a rate limiter; or only not yet
// scheduled) reaches the old config's sangho_dedup afterwards. Within
// the linger it is served on the old config's store, not refused as
// closed. Caddy stopping ends it, once its servers have stopped.
const DefaultReloadLinger = 10 * time.Second

// reloadLinger is DefaultReloadLinger, or a test's (SetReloadLinger).
var reloadLinger atomic.Int64

func init() { reloadLinger.Store(int64(DefaultReloadLinger)) }

// SetReloadLinger sets how long the Releases from now on linger, and
// returns a func that puts back the value before: for tests that must
// see the uses counted alone keep a resource.
func SetReloadLinger(d time.Duration) (restore func()) {
	old := reloadLinger.Swap(int64(d))
	return func() { reloadLinger.Store(old) }
}

// lingering counts the Releases in their linger with no use counted:
// Caddy stopping ends their linger (endLingers) and waits for them, so
// that every resource a reload left is closed once Caddy has stopped.
// Every Release that Adds to it runs while Caddy runs a config (under
// Caddy's own lock of its config, as a config's cleanup does), never
// beside the Wait of a stop.
var lingering sync.WaitGroup

// stops counts Caddy's stops (the Release of a stopping config, after
// its servers have stopped; Caddy's exit, in case no such Release
// comes): a Release's linger ends when it changes.
var (
	stops    atomic.Int64
	exitHook sync.Once
)

// endLingers ends the lingers under way and waits for their close.
func endLingers() {
	stops.Add(1)
	lingering.Wait()
}

// reloading reports whether a config is running: a Release is then a
// reload's (or a failed load's), not Caddy stopping, whose Stop has set
// no config running before it stops the servers and cleans up.
func reloading() bool { return caddy.ActiveContext().Context != nil }

// Release gives up this config's use of the pooled resource key: when
// Caddy stops, at once if nothing uses it; else (a reload, or uses
// counted) in the background, once nothing uses it and, on a reload,
// the linger has passed or Caddy has stopped meanwhile.
func (u *Users) Release(key string, logger *zap.Logger) error {
	linger := reloading()
	if linger {
		exitHook.Do(func() { caddy.OnExit(func(context.Context) { endLingers() }) })
	} else {
		defer endLingers()
	}
	gen, lingerFor := stops.Load(), time.Duration(reloadLinger.Load())
	u.mu.Lock()
	if u.releasing || u.n.Load()&releasedAtOnce != 0 { // released already
		u.mu.Unlock()
		return nil
	}
	if !linger && u.n.CompareAndSwap(0, releasedAtOnce) {
		defer u.mu.Unlock()
		_, err := Pool.Delete(key)
		return err
	}
	u.releasing = true
	u.mu.Unlock()
	if linger {
		lingering.Add(1)
	}
	go func() {
		// Set releasedAtOnce once the count is 0 (or at the deadline), with
		// u.mu held as the at-once path does, so that a use entering from
		// then on is told Closed and none slips in before the close.
		start := time.Now()
		deadline := start.Add(dedup.DrainFor)
		done := func() {
			if linger {
				linger = false
				lingering.Done()
			}
		}
		defer done() // after the close, when the linger ended with no use
		for {
			u.mu.Lock()
			// Caddy exiting has set no config running, but its servers
			// are still finishing their requests (its grace period):
			// the linger ends when it has stopped them (stops).
			if linger && time.Since(start) < lingerFor && stops.Load() == gen && (reloading() || caddy.Exiting()) {
				u.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if u.n.CompareAndSwap(0, releasedAtOnce) {
				break
			}
			done() // uses still counted: as any drain, not waited for at Stop
			if !time.Now().Before(deadline) {
				u.n.Add(releasedAtOnce)
				break
			}
			u.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
		_, err := Pool.Delete(key)
		u.mu.Unlock()
		if err != nil && logger != nil {
			logger.Error("shared store close failed", zap.String("resource", key), zap.Error(err))
		}
	}()
	return nil
}
