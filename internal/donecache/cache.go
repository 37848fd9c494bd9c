// Package donecache is the stores' local cache of done records: a
// bounded map of the done records a store has read, served only while
// the connection that tells it of changes (Redis's tracking connection,
// PostgreSQL's listening one) is up and has answered recently, emptied
// whenever that connection is lost, and kept by a reconnecting loop
// (Keeper). A store supplies only how it hears of changes: a session
// that connects, calls Keeper.Up, and applies what it hears with Drop,
// Invalidate and Flush.
//
// One choice for both stores, from the two they had: entries expire on
// the monotonic clock (a wall-clock step cannot lengthen an entry's
// life past its record's), and a full cache drops the least recently
// used entry (CLOCK), so that a hot duplicate is not the one evicted.
package donecache

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/mono"
)

// Staleness is how long the connection that keeps a cache true may go
// without answering before the cache stops serving (it may be cut off
// silently, and the changes with it).
const Staleness = 3 * time.Second

// Cache holds done records by key. The zero value is not usable: New.
type Cache struct {
	max int
	now func() int64 // monotonic nanoseconds

	// live is set while the connection that keeps the cache true is up
	// and has answered recently: only then are entries served or learned.
	live      atomic.Bool
	heard     atomic.Int64 // when that connection last answered
	staleness int64

	mu   sync.RWMutex
	m    map[string]*entry
	ring []*entry // CLOCK ring; nil slots are free
	free []int
	hand int
	// gen counts the invalidations that may race with a look-up: a
	// look-up sent before one may carry the record it removed, so its
	// Put is refused.
	gen uint64

	hits, learned, invalidated atomic.Int64 // for tests and debugging
}

type entry struct {
	key     string
	val     string
	expires int64 // monotonic ns; 0: no expiry
	slot    int
	ref     atomic.Bool
}

// New returns an empty cache of at most max entries, not live.
func New(max int) *Cache {
	return &Cache{max: max, now: mono.Now, staleness: int64(Staleness), m: map[string]*entry{}}
}

// Now is the cache's clock (monotonic nanoseconds), for expiries.
func (c *Cache) Now() int64 { return c.now() }

// ExpiresIn is the expiry, on the cache's clock, of a record with d of
// its life left at from (saturated: a very long life never wraps into
// the past). A record with no time left expires at from.
func ExpiresIn(from int64, d time.Duration) int64 {
	d = max(d, 0)
	return from + int64(min(d, time.Duration(math.MaxInt64-from)))
}

// Get returns the done record cached for key, if the cache is served.
func (c *Cache) Get(key string) (string, bool) {
	if !c.live.Load() {
		return "", false
	}
	c.mu.RLock()
	e := c.m[key]
	var val string
	var expires int64
	if e != nil { // Put may rewrite them: read under the lock
		val, expires = e.val, e.expires
	}
	c.mu.RUnlock()
	if e == nil {
		return "", false
	}
	now := c.now()
	if now-c.heard.Load() > c.staleness {
		// The connection has not answered its heartbeats: it may be cut
		// off silently, and the changes with it.
		return "", false
	}
	if expires != 0 && now >= expires {
		c.Drop(key)
		return "", false
	}
	if !e.ref.Load() {
		e.ref.Store(true)
	}
	c.hits.Add(1)
	return val, true
}

// Generation is the current invalidation generation, read before a
// look-up is sent and given to its Put.
func (c *Cache) Generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// Put caches key's done record, read by a look-up sent at generation
// gen, expiring at expires on the cache's clock (0: never). It is
// refused when the cache is not live or an invalidation came since gen.
func (c *Cache) Put(key, val string, expires int64, gen uint64) {
	if !c.live.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if e := c.m[key]; e != nil {
		e.val, e.expires = val, expires
		return
	}
	e := &entry{key: key, val: val, expires: expires}
	switch {
	case len(c.free) > 0:
		e.slot = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	case len(c.ring) < c.max:
		e.slot = len(c.ring)
		c.ring = append(c.ring, nil)
	default:
		e.slot = c.evictLocked()
	}
	c.ring[e.slot] = e
	c.m[key] = e
	c.learned.Add(1)
}

// evictLocked removes the first entry the clock hand finds unused since
// it last passed, and returns its slot. The ring is full.
func (c *Cache) evictLocked() int {
	for {
		c.hand = (c.hand + 1) % len(c.ring)
		e := c.ring[c.hand]
		if e.ref.Load() {
			e.ref.Store(false)
			continue
		}
		delete(c.m, e.key)
		return c.hand
	}
}

// Invalidate removes key and refuses the Puts of look-ups sent before:
// for a change that may overtake a look-up's reply (this process's own
// forget; a notification on a connection other than the look-ups').
func (c *Cache) Invalidate(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.dropLocked(key)
	c.invalidated.Add(1)
}

// Drop removes key: for a change that reaches the cache after the
// replies to every look-up sent before it (Redis's invalidation, on the
// connection that carries the look-ups), and for an expired entry.
func (c *Cache) Drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(key)
}

func (c *Cache) dropLocked(key string) {
	if e := c.m[key]; e != nil {
		delete(c.m, key)
		c.ring[e.slot] = nil
		c.free = append(c.free, e.slot)
	}
}

// Flush removes every entry and refuses the Puts of look-ups sent
// before.
func (c *Cache) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.m)
	c.ring, c.free, c.hand = c.ring[:0], c.free[:0], 0
	c.invalidated.Add(1)
}

// up empties the cache (it may have missed changes until now) and
// serves it from now on.
func (c *Cache) up() {
	c.Flush()
	c.Heard()
	c.live.Store(true)
}

// Down stops serving and learning, and empties the cache: changes may be
// missed from now on. Call it as soon as the connection is known lost.
func (c *Cache) Down() {
	c.live.Store(false)
	c.Flush()
}

// Heard records an answer on the connection that keeps the cache true.
func (c *Cache) Heard() { c.heard.Store(c.now()) }

// Live reports whether the connection is up (entries are served while
// it has answered within Staleness).
func (c *Cache) Live() bool { return c.live.Load() }

// Has reports whether key is cached (whether or not it would be served).
func (c *Cache) Has(key string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[key] != nil
}

// Expires is key's expiry on the cache's clock (0: none, or not cached).
func (c *Cache) Expires(key string) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.m[key]; e != nil {
		return e.expires
	}
	return 0
}

// Len is the number of entries.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Hits is the number of records served; Invalidated the number of
// invalidations and flushes (Invalidate, Flush): for tests and
// debugging.
func (c *Cache) Hits() int64        { return c.hits.Load() }
func (c *Cache) Invalidated() int64 { return c.invalidated.Load() }
