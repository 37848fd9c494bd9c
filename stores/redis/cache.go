package redis

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/donecache"
	"github.com/sangho/caddy-sangho-dedup/internal/sat"
)

// The local cache of done records (internal/donecache) holds, on a
// standalone Redis, the done records this process has seen, so that a
// redelivery of a processed event is answered without a round trip. A
// done record changes only when it expires or is deleted (or rewritten
// by a retried commit): the cache holds an entry only while Redis tracks
// the key for it (CLIENT TRACKING on the tracker's own connection),
// drops the entry when Redis says the key changed, and is emptied
// whenever that connection is lost, since invalidations may have been
// missed, or when Redis invalidates every key (FLUSHDB, FLUSHALL, DEBUG
// RELOAD, a replica's full resync). Redis sends nothing for SWAPDB
// (tracking is by key name, not database): docs/redis.md tells the
// operator to close the tracking connection after one. Entries also
// expire with the record's time to live.
//
// Redis pushes an invalidation on the connection that carries the
// look-ups, after the replies to the look-ups it ran before the change:
// an invalidation only drops the key (donecache.Cache.Drop), and look-ups
// of other keys in flight stay good. A forget through this store
// invalidates with a new generation (Invalidate): Redis's own
// invalidation of it is still on the way.

// doneCache is the local cache, as the store names it.
type doneCache = donecache.Cache

func newDoneCache(max int) *doneCache { return donecache.New(max) }

// tracker keeps the cache's tracking connection: it dials, enables
// CLIENT TRACKING (RESP3, default mode: Redis remembers the keys this
// connection reads and pushes an invalidation when one changes), reads
// the done records the store asks it to learn (GET and PTTL, so that
// Redis tracks them), applies invalidations, and sends a heartbeat every
// second. It redials after a failure, with the cache empty and not
// served until tracking is on again.
type tracker struct {
	cs     connSettings
	cache  *donecache.Cache
	logger *zap.Logger
	learnQ chan string

	pingEvery time.Duration
	keeper    *donecache.Keeper

	mu      sync.Mutex
	pending map[string]bool // keys queued or awaiting their reply
	beats   atomic.Int64    // heartbeats answered, for tests
}

// maxLearnQueue bounds the keys waiting to be looked up: past it a
// redelivery simply is not cached yet.
const maxLearnQueue = 1024

func newTracker(cs connSettings, cache *donecache.Cache, logger *zap.Logger) *tracker {
	t := &tracker{
		cs: cs, cache: cache, logger: logger,
		learnQ:    make(chan string, maxLearnQueue),
		pingEvery: time.Second,
		pending:   map[string]bool{},
	}
	t.keeper = donecache.Keep(cache, t.session, donecache.Hooks{
		Off: func(err error) {
			if isNoPerm(err) {
				logger.Warn("local_cache off", zap.String("cause", "permission"),
					zap.String("needs", t.needs()), zap.Error(err))
			} else {
				logger.Info("local_cache off", zap.String("cause", "tracking connection lost"), zap.Error(err))
			}
		},
		On: func() { logger.Info("local_cache on") },
		// counted in caddy_sangho_dedup_local_cache_off while not served
		Gauge: func(off bool) {
			if off {
				metrics.cacheOff.Inc()
			} else {
				metrics.cacheOff.Dec()
			}
		},
		Wait: func(err error) time.Duration {
			if isNoPerm(err) {
				return 10 * time.Second // until the ACL changes
			}
			return 0
		},
	})
	return t
}

// close stops the tracker and waits for it (bounded by the connection's
// timeouts).
func (t *tracker) close() { t.keeper.Close() }

// conns is the number of tracking connections established, for tests.
func (t *tracker) conns() int64 { return t.keeper.Conns() }

// learn asks the tracker to cache key, which the store just found to
// hold a done record. It never blocks.
func (t *tracker) learn(key string) {
	if !t.cache.Live() {
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

// trackedCall is what a reply on the tracking connection answers.
type trackedCall struct {
	op   byte // 'g' GET, 't' PTTL, 'p' heartbeat
	key  string
	sent int64
	gen  uint64 // the cache's generation when sent
}

// session runs one tracking connection until it fails or ctx ends.
func (t *tracker) session(ctx context.Context, k *donecache.Keeper) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nc, br, _, err := t.cs.open(ctx, 3, []string{"CLIENT", "TRACKING", "ON"})
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); nc.Close() }()

	// The calls in the order they were written: the writer appends, the
	// reader pops.
	var mu sync.Mutex
	var calls []trackedCall
	werr := make(chan error, 1)
	go func() { werr <- t.write(ctx, nc, &mu, &calls) }()

	k.Up()
	err = t.read(nc, br, &mu, &calls)
	t.cache.Down() // at once: invalidations may be lost from now on
	cancel()
	if werr := <-werr; err == nil {
		err = werr
	}
	for _, c := range calls {
		if c.op == 't' { // every look-up ends with its PTTL
			t.done(c.key)
		}
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
		now, gen := t.cache.Now(), t.cache.Generation()
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
		t.cache.Heard()
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
					exp = donecache.ExpiresIn(c.sent, msDuration(r.num))
				}
				t.cache.Put(c.key, val.str, exp, c.gen)
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
		t.cache.Flush()
		return
	}
	for _, k := range keys.elems {
		t.cache.Drop(k.str)
	}
}
