// Package memstate is a sharded map of dedup values with per-entry
// expiry and a sweeper: the memory store's state, and the file store's
// leases.
package memstate

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

const memShards = 64

type memEntry struct {
	val     string
	expires time.Time
}

type memShard struct {
	mu sync.Mutex
	m  map[string]memEntry
}

// State is a sharded map with per-entry expiry and a sweeper.
type State struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [memShards]memShard
	stop   chan struct{}
	done   chan struct{}
}

func New(now func() time.Time, sweepEvery time.Duration) *State {
	s := &State{now: now, seed: maphash.MakeSeed(), stop: make(chan struct{}), done: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].m = make(map[string]memEntry)
	}
	go s.sweeper(sweepEvery)
	return s
}

func (s *State) shard(key string) *memShard {
	return &s.shards[maphash.String(s.seed, key)%memShards]
}

// get returns the live entry of key; the caller holds the shard lock.
func (s *State) get(sh *memShard, key string, now time.Time) (memEntry, bool) {
	e, ok := sh.m[key]
	if ok && !now.Before(e.expires) {
		delete(sh.m, key)
		return memEntry{}, false
	}
	return e, ok
}

// Claim returns what it found besides the result ("" if it claimed).
func (s *State) Claim(key, token string, ttl time.Duration) (dedup.ClaimResult, string) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := s.get(sh, key, now); ok {
		if res := dedup.Classify(e.val, token); res != dedup.Claimed {
			return res, e.val
		}
		return dedup.Claimed, ""
	}
	sh.m[key] = memEntry{val: dedup.LeaseValue(token), expires: now.Add(ttl)}
	return dedup.Claimed, ""
}

// Lookup returns key's live entry.
func (s *State) Lookup(key string) (dedup.Entry, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	return dedup.Entry{Value: e.val, ExpiresAt: e.expires}, ok
}

// Forget deletes key if forgettable, and returns what it held.
func (s *State) Forget(key string, force bool) (dedup.Entry, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	if !ok {
		return dedup.Entry{}, false
	}
	deleted := dedup.Forgettable(e.val, force)
	if deleted {
		delete(sh.m, key)
	}
	return dedup.Entry{Value: e.val, ExpiresAt: e.expires}, deleted
}

func (s *State) Renew(key, token string, ttl time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !dedup.IsLease(e.val, token) {
		return false
	}
	e.expires = now.Add(ttl)
	sh.m[key] = e
	return true
}

func (s *State) Commit(key, token, rec string, retention time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	held := ok && dedup.IsLease(e.val, token)
	sh.m[key] = memEntry{val: rec, expires: now.Add(retention)}
	return held
}

func (s *State) Release(key, token string) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !dedup.IsLease(e.val, token) {
		return false
	}
	delete(sh.m, key)
	return true
}

// Sweep deletes every expired entry and returns how many it deleted.
func (s *State) Sweep() int {
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

func (s *State) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Destruct stops the sweeper; the usage pool calls it when the last
// config using the memory state is cleaned up.
func (s *State) Destruct() error {
	close(s.stop)
	<-s.done
	return nil
}

// Put sets key to val until expires, whatever it held (the file store
// taking back the leases it parked).
func (s *State) Put(key, val string, expires time.Time) {
	sh := s.shard(key)
	sh.mu.Lock()
	sh.m[key] = memEntry{val: val, expires: expires}
	sh.mu.Unlock()
}

// Range calls f for every live entry, one shard locked at a time, and
// stops at f's first error.
func (s *State) Range(f func(key, val string, expires time.Time) error) error {
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, e := range sh.m {
			if now.Before(e.expires) {
				if err := f(key, e.val, e.expires); err != nil {
					sh.mu.Unlock()
					return err
				}
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// Len counts the entries, expired or not.
func (s *State) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Interface guard
var _ caddy.Destructor = (*State)(nil)
