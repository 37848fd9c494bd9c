package sanghodedup

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(MemoryStore{})
}

// MemoryStore keeps dedup state in this process's memory. It is atomic
// and fast, and it survives config reloads, but it is neither durable
// (a restart forgets every processed event) nor shared between Caddy
// instances: use it for development and single-instance setups only.
//
// Expired entries are swept once a minute.
type MemoryStore struct {
	state *memState
}

// CaddyModule returns the Caddy module information.
func (MemoryStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.memory",
		New: func() caddy.Module { return new(MemoryStore) },
	}
}

// memPoolKey is the key of the process-wide memory state in the usage
// pool: every memory store of every config shares it, so a reload keeps
// the processed IDs (routes keep apart by key_prefix).
const memPoolKey = "sangho_dedup.memory"

// Provision attaches the store to the process-wide memory state.
func (m *MemoryStore) Provision(ctx caddy.Context) error {
	// Not durable (a restart forgets processed events), not shared
	// between Caddy instances: for tests and trials only.
	ctx.Logger().Warn("memory store is neither durable nor shared")
	v, _, err := storePool.LoadOrNew(memPoolKey, func() (caddy.Destructor, error) {
		return newMemState(time.Now, time.Minute), nil
	})
	if err != nil {
		return err
	}
	m.state = v.(*memState)
	return nil
}

// Cleanup releases this config's use of the memory state; the sweeper
// stops when no config uses it any more.
func (m *MemoryStore) Cleanup() error {
	if m.state == nil {
		return nil
	}
	_, err := storePool.Delete(memPoolKey)
	return err
}

// UnmarshalCaddyfile accepts `store memory` with no arguments or block.
func (m *MemoryStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if d.NextArg() {
		return d.ArgErr()
	}
	if nesting := d.Nesting(); d.NextBlock(nesting) {
		return d.Errf("takes no options, found %q", d.Val())
	}
	return nil
}

// Claim implements Store.
func (m *MemoryStore) Claim(_ context.Context, key, token string, ttl time.Duration) (ClaimResult, string, error) {
	res, val := m.state.claim(key, token, ttl)
	return res, val, nil
}

// Renew implements Store.
func (m *MemoryStore) Renew(_ context.Context, key, token string, ttl time.Duration) (bool, error) {
	return m.state.renew(key, token, ttl), nil
}

// Commit implements Store.
func (m *MemoryStore) Commit(_ context.Context, key, token string, rec DoneRecord, retention time.Duration) (bool, error) {
	return m.state.commit(key, token, rec.encode(), retention), nil
}

// Release implements Store.
func (m *MemoryStore) Release(_ context.Context, key, token string) (bool, error) {
	return m.state.release(key, token), nil
}

// Get implements Store.
func (m *MemoryStore) Get(_ context.Context, key string) (Entry, error) {
	e, _ := m.state.lookup(key)
	return e, nil
}

// Forget implements Store.
func (m *MemoryStore) Forget(_ context.Context, key string, force bool) (Entry, bool, error) {
	e, deleted := m.state.forget(key, force)
	return e, deleted, nil
}

const memShards = 64

type memEntry struct {
	val     string
	expires time.Time
}

type memShard struct {
	mu sync.Mutex
	m  map[string]memEntry
}

// memState is a sharded map with per-entry expiry and a sweeper.
type memState struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [memShards]memShard
	stop   chan struct{}
	done   chan struct{}
}

func newMemState(now func() time.Time, sweepEvery time.Duration) *memState {
	s := &memState{now: now, seed: maphash.MakeSeed(), stop: make(chan struct{}), done: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].m = make(map[string]memEntry)
	}
	go s.sweeper(sweepEvery)
	return s
}

func (s *memState) shard(key string) *memShard {
	return &s.shards[maphash.String(s.seed, key)%memShards]
}

// get returns the live entry of key; the caller holds the shard lock.
func (s *memState) get(sh *memShard, key string, now time.Time) (memEntry, bool) {
	e, ok := sh.m[key]
	if ok && !now.Before(e.expires) {
		delete(sh.m, key)
		return memEntry{}, false
	}
	return e, ok
}

// claim returns what it found besides the result ("" if it claimed).
func (s *memState) claim(key, token string, ttl time.Duration) (ClaimResult, string) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := s.get(sh, key, now); ok {
		if res := classify(e.val, token); res != Claimed {
			return res, e.val
		}
		return Claimed, ""
	}
	sh.m[key] = memEntry{val: inflightValue(token), expires: now.Add(ttl)}
	return Claimed, ""
}

// lookup returns key's live entry.
func (s *memState) lookup(key string) (Entry, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	return Entry{Value: e.val, ExpiresAt: e.expires}, ok
}

// forget deletes key if forgettable, and returns what it held.
func (s *memState) forget(key string, force bool) (Entry, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	if !ok {
		return Entry{}, false
	}
	deleted := forgettable(e.val, force)
	if deleted {
		delete(sh.m, key)
	}
	return Entry{Value: e.val, ExpiresAt: e.expires}, deleted
}

func (s *memState) renew(key, token string, ttl time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !isLease(e.val, token) {
		return false
	}
	e.expires = now.Add(ttl)
	sh.m[key] = e
	return true
}

func (s *memState) commit(key, token, rec string, retention time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	held := ok && isLease(e.val, token)
	sh.m[key] = memEntry{val: rec, expires: now.Add(retention)}
	return held
}

func (s *memState) release(key, token string) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !isLease(e.val, token) {
		return false
	}
	delete(sh.m, key)
	return true
}

// sweep deletes every expired entry and returns how many it deleted.
func (s *memState) sweep() int {
	n := 0
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if !now.Before(e.expires) {
				delete(sh.m, k)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

func (s *memState) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// Destruct stops the sweeper; the usage pool calls it when the last
// config using the memory state is cleaned up.
func (s *memState) Destruct() error {
	close(s.stop)
	<-s.done
	return nil
}

// Interface guards
var (
	_ Store                 = (*MemoryStore)(nil)
	_ caddy.Provisioner     = (*MemoryStore)(nil)
	_ caddy.CleanerUpper    = (*MemoryStore)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStore)(nil)
	_ caddy.Destructor      = (*memState)(nil)
)

// stateID: every memory store of this process shares one state.
func (m *MemoryStore) stateID() string { return "memory" }
