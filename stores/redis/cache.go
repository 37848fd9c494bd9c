package redis

import (
	"bufio"
	"context"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/mono"
	"github.com/sangho/caddy-sangho-dedup/internal/sat"
)

// doneCache holds done records that this process has seen in Redis, so
// that a redelivery of a processed event is answered without a round
// trip. A done record changes only when it expires or is deleted (or
// rewritten by a retried commit): the cache holds an entry only while
// Redis tracks the key for it (CLIENT TRACKING on the tracker's own
// connection), drops the entry when Redis says the key changed, and
// drops everything whenever that connection is lost, since
// invalidations may have been missed, or when Redis invalidates every
// key (FLUSHDB, FLUSHALL, DEBUG RELOAD, a replica's full resync). Redis
// sends nothing for SWAPDB (tracking is by key name, not database): the
// README tells the operator to close the tracking connection after one.
// Entries also expire with the record's time to live. At most max
// entries are kept; the least recently used go first (CLOCK).
type doneCache struct {
	max int
	now func() int64 // monotonic nanoseconds

	// live is set while the tracking connection is up and has answered
	// recently: only then are entries served.
	live      atomic.Bool
	heard     atomic.Int64 // when the tracking connection last answered
	staleness int64        // how long without an answer makes it not live

	mu   sync.RWMutex
	m    map[string]*cacheEntry
	ring []*cacheEntry // CLOCK ring; nil slots are free
	free []int
	hand int
	// gen counts the forgets made through this store: a look-up sent
	// before one may carry a record the forget deleted, so its reply
	// is not cached.
	gen uint64

	hits, learned, invalidated atomic.Int64 // for tests and debugging
}

type cacheEntry struct {
	key     string
	val     string
	expires int64 // monotonic ns; 0: no expiry
	slot    int
	ref     atomic.Bool
}

func newDoneCache(max int) *doneCache {
	return &doneCache{max: max, now: mono.Now, staleness: int64(3 * time.Second), m: map[string]*cacheEntry{}}
}

// get returns the done record cached for key.
func (c *doneCache) get(key string) (string, bool) {
	if !c.live.Load() {
		return "", false
	}
	c.mu.RLock()
	e := c.m[key]
	var val string
	var expires int64
	if e != nil { // put may rewrite them: read under the lock
		val, expires = e.val, e.expires
	}
	c.mu.RUnlock()
	if e == nil {
		return "", false
	}
	now := c.now()
	if now-c.heard.Load() > c.staleness {
		// The tracking connection has not answered its heartbeats: it may
		// be cut off silently, and invalidations with it.
		return "", false
	}
	if expires != 0 && now >= expires {
		c.drop(key)
		return "", false
	}
	if !e.ref.Load() {
		e.ref.Store(true)
	}
	c.hits.Add(1)
	return val, true
}

// has reports whether key is cached (whether or not it would be served).
func (c *doneCache) has(key string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[key] != nil
}

// put caches key's done record, read by a look-up sent at generation
// gen (unless a forget came since).
func (c *doneCache) put(key, val string, expires int64, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if e := c.m[key]; e != nil {
		e.val, e.expires = val, expires
		return
	}
	e := &cacheEntry{key: key, val: val, expires: expires}
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
func (c *doneCache) evictLocked() int {
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

// generation is the current forget generation, for a look-up's put.
func (c *doneCache) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// forget removes key at once, without waiting for Redis's invalidation,
// and keeps the look-ups already sent from putting a record back.
func (c *doneCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.dropLocked(key)
}

// drop removes key.
func (c *doneCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(key)
}

func (c *doneCache) dropLocked(key string) {
	if e := c.m[key]; e != nil {
		delete(c.m, key)
		c.ring[e.slot] = nil
		c.free = append(c.free, e.slot)
	}
}

// flush removes every entry.
func (c *doneCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	c.ring, c.free, c.hand = c.ring[:0], c.free[:0], 0
}

// len is the number of entries.
func (c *doneCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// tracker keeps the cache's tracking connection: it dials, enables
// CLIENT TRACKING (RESP3, default mode: Redis remembers the keys this
// connection reads and pushes an invalidation when one changes), reads
// the done records the store asks it to learn (GET and PTTL, so that
// Redis tracks them), applies invalidations, and sends a heartbeat every
// second. It redials after a failure, with the cache empty and not
// served until tracking is on again.
type tracker struct {
	cs     connSettings
	cache  *doneCache
	logger *zap.Logger
	learnQ chan string

	pingEvery time.Duration
	stop      chan struct{}
	stopped   chan struct{}

	wasOff bool // a failure was logged: say when the cache is back (run's goroutine)
	off    bool // counted in caddy_sangho_dedup_local_cache_off (run's goroutine)

	mu      sync.Mutex
	pending map[string]bool // keys queued or awaiting their reply
	conns   atomic.Int64    // tracking connections established, for tests
	beats   atomic.Int64    // heartbeats answered, for tests
}

// maxLearnQueue bounds the keys waiting to be looked up: past it a
// redelivery simply is not cached yet.
const maxLearnQueue = 1024

func newTracker(cs connSettings, cache *doneCache, logger *zap.Logger) *tracker {
	t := &tracker{
		cs: cs, cache: cache, logger: logger,
		learnQ:    make(chan string, maxLearnQueue),
		pingEvery: time.Second,
		stop:      make(chan struct{}),
		stopped:   make(chan struct{}),
		pending:   map[string]bool{},
	}
	go t.run()
	return t
}

// close stops the tracker and waits for it (bounded by the connection's
// timeouts).
func (t *tracker) close() {
	close(t.stop)
	<-t.stopped
}

// learn asks the tracker to cache key, which the store just found to
// hold a done record. It never blocks.
func (t *tracker) learn(key string) {
	if !t.cache.live.Load() {
		return
	}
	t.mu.Lock()
	if t.pending[key] || len(t.pending) >= maxLearnQueue {
		t.mu.Unlock()
		return
	}
	t.pending[key] = true
	t.mu.Unlock()
	select {
	case t.learnQ <- key:
	default:
		t.done(key)
	}
}

func (t *tracker) done(key string) {
	t.mu.Lock()
	delete(t.pending, key)
	t.mu.Unlock()
}

func (t *tracker) run() {
	defer close(t.stopped)
	t.setOff(true) // until the first tracking connection is up
	defer t.setOff(false)
	backoff := 100 * time.Millisecond
	var lastErr string // the failure last logged, logged once until tracking is back
	for {
		established := t.conns.Load()
		err := t.session()
		t.cache.flush()
		select {
		case <-t.stop:
			return
		default:
		}
		if t.conns.Load() > established {
			// It was up: a new loss is worth a log line, and a prompt
			// reconnection.
			lastErr, backoff = "", 100*time.Millisecond
		}
		if err != nil && err.Error() != lastErr {
			if isNoPerm(err) {
				t.logger.Warn("local_cache off", zap.String("cause", "permission"),
					zap.String("needs", t.needs()), zap.Error(err))
			} else {
				t.logger.Info("local_cache off", zap.String("cause", "tracking connection lost"), zap.Error(err))
			}
			lastErr, t.wasOff = err.Error(), true
		}
		if isNoPerm(err) {
			backoff = 10 * time.Second // until the ACL changes
		}
		select {
		case <-t.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
		if !isNoPerm(err) {
			backoff = min(backoff, 5*time.Second)
		}
	}
}

// needs names the commands the tracking connection sends, for the log
// line that says one was refused.
func (t *tracker) needs() string {
	n := "CLIENT TRACKING, GET and PTTL (the ACL in the README)"
	if t.cs.db != 0 {
		n += ", SELECT (db)"
	}
	if t.cs.clientName != "" {
		n += ", CLIENT SETNAME (client_name)"
	}
	return n
}

// setOff counts this tracker in caddy_sangho_dedup_local_cache_off while
// its cache is not served.
func (t *tracker) setOff(off bool) {
	if off != t.off {
		t.off = off
		if off {
			metrics.cacheOff.Inc()
		} else {
			metrics.cacheOff.Dec()
		}
	}
}

// trackedCall is what a reply on the tracking connection answers.
type trackedCall struct {
	op   byte // 'g' GET, 't' PTTL, 'p' heartbeat
	key  string
	sent int64
	gen  uint64 // the cache's forget generation when sent
}

// session runs one tracking connection until it fails or the tracker
// stops.
func (t *tracker) session() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	nc, br, _, err := t.cs.open(ctx, 3, []string{"CLIENT", "TRACKING", "ON"})
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); nc.Close() }()
	t.conns.Add(1)

	// The calls in the order they were written: the writer appends, the
	// reader pops.
	var mu sync.Mutex
	var calls []trackedCall
	werr := make(chan error, 1)
	go func() { werr <- t.write(ctx, nc, &mu, &calls) }()

	t.cache.heard.Store(t.cache.now())
	t.cache.live.Store(true)
	t.setOff(false)
	if t.wasOff {
		t.logger.Info("local_cache on")
		t.wasOff = false
	}
	err = t.read(nc, br, &mu, &calls)
	t.cache.live.Store(false) // at once: invalidations may be lost from now on
	t.setOff(true)
	cancel()
	if werr := <-werr; err == nil {
		err = werr
	}
	for _, c := range calls {
		if c.op == 't' { // every look-up ends with its PTTL
			t.done(c.key)
		}
	}
	select {
	case <-t.stop:
		return nil
	default:
	}
	return err
}

// write sends the lookups the store asks for, and a heartbeat every
// pingEvery when there is nothing to look up. The heartbeat is CLIENT
// TRACKING ON again, not PING: the cache needs that permission anyway
// (re-enabling tracking in the same mode keeps the keys tracked), and
// the README's ACL grants no PING.
func (t *tracker) write(ctx context.Context, nc net.Conn, mu *sync.Mutex, calls *[]trackedCall) error {
	tick := time.NewTicker(t.pingEvery)
	defer tick.Stop()
	var b []byte
	var keys []string
	for {
		b, keys = b[:0], keys[:0]
		select {
		case <-ctx.Done():
			return nil
		case key := <-t.learnQ:
			keys = append(keys, key)
			for len(keys) < 128 {
				select {
				case key = <-t.learnQ:
					keys = append(keys, key)
					continue
				default:
				}
				break
			}
		case <-tick.C:
		}
		mu.Lock()
		now, gen := t.cache.now(), t.cache.generation()
		for _, key := range keys {
			b = appendCommand(b, "GET", key)
			b = appendCommand(b, "PTTL", key)
			*calls = append(*calls, trackedCall{op: 'g', key: key, sent: now, gen: gen}, trackedCall{op: 't', key: key, sent: now, gen: gen})
		}
		if len(keys) == 0 {
			b = appendCommand(b, "CLIENT", "TRACKING", "ON")
			*calls = append(*calls, trackedCall{op: 'p'})
		}
		_ = nc.SetReadDeadline(time.Now().Add(sat.Add(t.pingEvery, t.cs.readTimeout)))
		mu.Unlock()
		_ = nc.SetWriteDeadline(time.Now().Add(t.cs.writeTimeout))
		if _, err := nc.Write(b); err != nil {
			return err
		}
	}
}

// read applies invalidations and the replies to the writer's calls.
func (t *tracker) read(nc net.Conn, br *bufio.Reader, mu *sync.Mutex, calls *[]trackedCall) error {
	var val reply // the GET reply, waiting for its PTTL
	var valKey string
	var valStale bool // an invalidation of valKey came between GET and PTTL
	for {
		r, err := readReply(br, 0)
		if err != nil {
			return err
		}
		t.cache.heard.Store(t.cache.now())
		if r.kind == '>' {
			if len(r.elems) == 2 && r.elems[0].str == "invalidate" {
				if valKey != "" {
					if r.elems[1].isNull() {
						valStale = true
					}
					for _, k := range r.elems[1].elems {
						valStale = valStale || k.str == valKey
					}
				}
				t.invalidate(r.elems[1])
			}
			continue
		}
		mu.Lock()
		if len(*calls) == 0 {
			mu.Unlock()
			return errProtocol
		}
		c := (*calls)[0]
		(*calls)[0] = trackedCall{}
		*calls = (*calls)[1:]
		if len(*calls) == 0 {
			*calls = nil
			_ = nc.SetReadDeadline(time.Time{})
		}
		mu.Unlock()
		if err := r.err(); err != nil && isNoPerm(err) {
			return err // without GET or PTTL the cache cannot work
		}
		switch c.op {
		case 'g':
			val, valKey, valStale = r, c.key, false
		case 'p':
			if r.err() == nil {
				t.beats.Add(1)
			}
		case 't':
			// Cache a done record with what remains of its life (-1:
			// none set; -2: the key is gone).
			if !valStale && val.kind == '$' && strings.HasPrefix(val.str, dedup.DonePrefix) && r.kind == ':' && r.num != -2 {
				var exp int64
				if r.num >= 0 {
					exp = c.sent + int64(min(msDuration(r.num), time.Duration(math.MaxInt64-c.sent)))
				}
				t.cache.put(c.key, val.str, exp, c.gen)
			}
			val, valKey = reply{}, ""
			t.done(c.key)
		}
	}
}

// invalidate applies an invalidation push: a list of keys, or null for
// "everything" (FLUSHALL, FLUSHDB, or Redis dropping its tracking
// table).
func (t *tracker) invalidate(keys reply) {
	if keys.isNull() {
		t.cache.flush()
		t.cache.invalidated.Add(1)
		return
	}
	for _, k := range keys.elems {
		t.cache.drop(k.str)
		t.cache.invalidated.Add(1)
	}
}
