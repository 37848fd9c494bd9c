// Package storepool shares store resources (a Redis client, an open
// file, the memory map, a PostgreSQL pool) across config reloads, and
// keeps them for the deliveries a cleaned-up config still has in flight.
package storepool

import (
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
// keeps the resource until they are done, for at most dedup.DrainFor.
type Users struct {
	// n counts the uses; releasedAtOnce is set in it when Release gives
	// the resource up: at once if it found none, else once the last use
	// left (or at the deadline).
	n  atomic.Int64
	mu sync.Mutex // held from setting releasedAtOnce until closed is known
	// closed: that Release closed the resource (no other config shared it).
	closed bool
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

// Closed reports whether Release closed the resource before the use
// that asks entered: one that enters before Release keeps the resource
// open, one that enters after it (a request that reached the handler
// after Caddy cleaned its config up) must not claim an event on it,
// since its commit could not land. Call it after Enter.
func (u *Users) Closed() bool {
	if u == nil || u.n.Load()&releasedAtOnce == 0 {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// Release gives up this config's use of the pooled resource key, at
// once if nothing uses it, else in the background once nothing does.
func (u *Users) Release(key string, logger *zap.Logger) error {
	u.mu.Lock()
	if u.releasing || u.n.Load()&releasedAtOnce != 0 { // released already
		u.mu.Unlock()
		return nil
	}
	if u.n.CompareAndSwap(0, releasedAtOnce) {
		defer u.mu.Unlock()
		deleted, err := Pool.Delete(key)
		u.closed = deleted
		return err
	}
	u.releasing = true
	u.mu.Unlock()
	go func() {
		// Set releasedAtOnce once the count is 0 (or at the deadline), with
		// u.mu held as the at-once path does, so that a use entering from
		// then on is told Closed and none slips in before the close.
		deadline := time.Now().Add(dedup.DrainFor)
		for {
			u.mu.Lock()
			if u.n.CompareAndSwap(0, releasedAtOnce) {
				break
			}
			if !time.Now().Before(deadline) {
				u.n.Add(releasedAtOnce)
				break
			}
			u.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
		deleted, err := Pool.Delete(key)
		u.closed = deleted
		u.mu.Unlock()
		if err != nil && logger != nil {
			logger.Error("shared store close failed", zap.String("resource", key), zap.Error(err))
		}
	}()
	return nil
}
