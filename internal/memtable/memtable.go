// Package memtable is a sharded map of dedup values with per-entry
// expiry and a sweeper: the memory store's table, and the file store's
// leases.
//
// A lease whose time ran out is kept dedup.MarkFor longer, as the mark of
// an attempt whose fate is unknown: a claim by another token over it is
// dedup.Reclaimed, Lookup returns it (its ExpiresAt, the lease's own, is
// past: Entry.State says "unknown"), Forget deletes it only with force. A
// release deletes it (the fate is known), a commit replaces it; the
// sweeper deletes it once MarkFor is over, as it deletes everything past
// its time.
package memtable

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

const memShards = 64

type memEntry struct {
	val     string
	expires time.Time
	// once: a journaled lease that was its key's only write to the
	// journal since the key's last deletion there (the key held no entry
	// when it was set: an entry leaves the map once its deletion is
	// queued in the journal, or written by the store (SettleWritten); a
	// lease the file store took back at its start is put back with Put,
	// which leaves once false). Such a lease can be deleted with Pebble's
	// SingleDelete: see HoldsOnce.
	once bool
	// replaced: the mark a lease took over (Reclaimed), put back by
	// Untake if the lease cannot be made durable.
	replaced *memEntry
	// retakes counts the retried Takes of this lease (the same token's,
	// live), each of which wrote it again. An Untake finding some undoes
	// nothing but one of them: the token's lease stays, since another of
	// its takes, retried or first, may be in effect, and their Untakes
	// may come in any order; the Untake of the last take in effect drops
	// the lease (or puts back the mark it replaced). A count, not a
	// saved lease: a key retried for days keeps one int.
	retakes int
}

// lease reports whether e is a lease (live, or a mark).
func (e memEntry) lease() bool { return strings.HasPrefix(e.val, dedup.InFlightPrefix) }

// entry is e as the store's operators see it, a mark told by now.
func (e memEntry) entry(now time.Time) dedup.Entry {
	return dedup.Entry{Value: e.val, ExpiresAt: e.expires, Mark: e.lease() && !e.expires.After(now)}
}

// kept reports whether e is still kept at now: until its expiry, and a
// lease MarkFor longer, as a mark.
func (e memEntry) kept(now time.Time) bool {
	if now.Before(e.expires) {
		return true
	}
	return e.lease() && now.Before(e.expires.Add(dedup.MarkFor))
}

type memShard struct {
	mu sync.Mutex
	m  map[string]memEntry
	// settles counts the Settle calls on the shard's keys (written
	// under mu): see Settles.
	settles atomic.Uint64
	// landing counts, per key, the records on their way to the file
	// store's disk (under mu): see Landing.
	landing map[string]int
}

// Journal is told of every change to the leases (and marks), under the
// lock of the key's shard, so that it sees the changes of one key in the
// order they happen: the file store writes them to disk. An error from
// Set or Delete leaves the state unchanged and is returned to the caller.
type Journal interface {
	// Set records that key holds the lease val until expires.
	Set(key, val string, expires time.Time) error
	// Delete records that keys hold no lease any more.
	Delete(keys ...string) error
	// Sync makes the changes recorded so far durable. It is called
	// without any lock held, after a claim or a renewal.
	Sync() error
	// Pending reports whether a change of key is recorded but not yet
	// on its way to disk: queued behind the write that asks (the file
	// store's commit, in its writer once the batch has taken the
	// changes recorded before it; see HoldsOnce and SettleWritten).
	// Called under the key's shard lock.
	Pending(key string) bool
}

// Table is a sharded map with per-entry expiry and a sweeper.
type Table struct {
	now     func() time.Time
	seed    maphash.Seed
	shards  [memShards]memShard
	journal Journal
	stop    chan struct{}
	done    chan struct{}
}

// New returns a Table on the clock now, swept every sweepEvery.
func New(now func() time.Time, sweepEvery time.Duration) *Table {
	return NewJournaled(now, sweepEvery, nil)
}

// NewJournaled is New with the leases' changes recorded in j (nil: none).
func NewJournaled(now func() time.Time, sweepEvery time.Duration, j Journal) *Table {
	s := &Table{now: now, seed: maphash.MakeSeed(), journal: j, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].m = make(map[string]memEntry)
	}
	go s.sweeper(sweepEvery)
	return s
}

func (s *Table) shard(key string) *memShard {
	return &s.shards[maphash.String(s.seed, key)%memShards]
}

// get returns the kept entry of key (live, or a mark); the caller holds
// the shard lock. An entry past its time stays until the sweeper takes
// it (or a write replaces it).
func (s *Table) get(sh *memShard, key string, now time.Time) (memEntry, bool) {
	e, ok := sh.m[key]
	if !ok || !e.kept(now) {
		return memEntry{}, false
	}
	return e, true
}

// setLease sets key to the lease val until expires, recorded first in
// the journal; the caller holds the shard lock.
func (s *Table) setLease(sh *memShard, key, val string, expires time.Time) error {
	if s.journal != nil {
		if err := s.journal.Set(key, val, expires); err != nil {
			return err
		}
	}
	_, had := sh.m[key] // any entry, past its time too: its write is still in the journal
	sh.m[key] = memEntry{val: val, expires: expires, once: s.journal != nil && !had}
	return nil
}

// relet writes e, a token's lease, again until expires (setLease),
// keeping what an Untake of a take still in flight needs: the mark it
// replaced and its retakes. The caller holds the shard lock.
func (s *Table) relet(sh *memShard, key string, e memEntry, expires time.Time) error {
	if err := s.setLease(sh, key, e.val, expires); err != nil {
		return err
	}
	ne := sh.m[key]
	ne.replaced, ne.retakes = e.replaced, e.retakes
	sh.m[key] = ne
	return nil
}

// drop deletes key's lease, recorded first in the journal; the caller
// holds the shard lock.
func (s *Table) drop(sh *memShard, key string) error {
	if s.journal != nil {
		if err := s.journal.Delete(key); err != nil {
			return err
		}
	}
	delete(sh.m, key)
	return nil
}

// Sync makes the journal's entries so far (a claim's or a renewal's)
// durable.
func (s *Table) Sync() error {
	if s.journal == nil {
		return nil
	}
	return s.journal.Sync()
}

// Claim returns what it found besides the result ("" if it claimed an
// absent key; the mark it took over if Reclaimed). The lease is in the
// journal, synced, when it returns.
func (s *Table) Claim(key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	res, found, wrote, err := s.Take(key, token, ttl)
	if err != nil || !wrote {
		return res, found, err
	}
	if err := s.Sync(); err != nil {
		// Not durable: the claim failed (see Untake).
		_ = s.Untake(key, token)
		return 0, "", err
	}
	return res, found, nil
}

// Take is Claim up to the journal's sync: the lease is taken in memory
// and recorded in the journal (wrote), not synced. The caller calls
// Sync before it relies on the lease, and calls Untake if Sync fails.
func (s *Table) Take(key, token string, ttl time.Duration) (res dedup.ClaimResult, found string, wrote bool, err error) {
	sh := s.shard(key)
	now := s.now()
	res = dedup.Claimed
	var replaced *memEntry
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := s.get(sh, key, now); ok {
		live := now.Before(e.expires)
		switch {
		case dedup.IsLease(e.val, token):
			// A retried claim: ours already, and it lives ttl again (as a
			// Renew), counted for Untake (retakes). Our own mark too: the
			// first take's sync may have stalled past its ttl, and its
			// Untake, if it comes, must not take the key from this one;
			// the mark it replaced, if any, stays the one to put back.
			e.retakes++
			if err := s.relet(sh, key, e, now.Add(ttl)); err != nil {
				return 0, "", false, err
			}
			return dedup.Claimed, "", s.journal != nil, nil
		case live:
			return dedup.Classify(e.val, token), e.val, false, nil
		default: // another attempt's mark, put back by Untake if this take fails
			replaced = &memEntry{val: e.val, expires: e.expires}
			res, found = dedup.Reclaimed, e.val
		}
	}
	if err := s.setLease(sh, key, dedup.LeaseValue(token), now.Add(ttl)); err != nil {
		return 0, "", false, err
	}
	if replaced != nil {
		e := sh.m[key]
		e.replaced = replaced
		sh.m[key] = e
	}
	return res, found, s.journal != nil, nil
}

// Untake undoes token's Take on key (unless the key is another's by
// now) for a claim that failed: its lease goes, and the mark it took
// over (Reclaimed) is put back, recorded in the journal again, so that
// the next delivery is still marked: the earlier attempt's fate is
// still unknown. Release instead would leave it unmarked. While the
// lease has been taken again by its token (retakes), an Untake leaves
// it: another of the token's takes may hold the key.
func (s *Table) Untake(key, token string) error {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	switch {
	case !ok || !dedup.IsLease(e.val, token):
		return nil
	case e.retakes > 0: // another take of the token's may be in effect: its lease stays
		e.retakes--
		sh.m[key] = e
		return nil
	case e.replaced != nil:
		return s.setLease(sh, key, e.replaced.val, e.replaced.expires)
	default:
		return s.drop(sh, key)
	}
}

// Lookup returns key's kept entry: live, or a mark.
func (s *Table) Lookup(key string) (dedup.Entry, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, ok := s.get(sh, key, now)
	return e.entry(now), ok
}

// Forget deletes key if forgettable (a lease or a mark only with force),
// and returns what it held.
func (s *Table) Forget(key string, force bool) (dedup.Entry, bool, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, s.now())
	if !ok {
		return dedup.Entry{}, false, nil
	}
	entry := e.entry(s.now())
	if !dedup.Forgettable(e.val, force) {
		return entry, false, nil
	}
	var err error
	if e.lease() {
		err = s.drop(sh, key)
	} else {
		delete(sh.m, key)
	}
	return entry, err == nil, err
}

// Renew extends the live lease of token on key to ttl (a mark is not
// renewed), synced in the journal when it returns true.
func (s *Table) Renew(key, token string, ttl time.Duration) (bool, error) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	e, ok := s.get(sh, key, now)
	if !ok || !now.Before(e.expires) || !dedup.IsLease(e.val, token) {
		sh.mu.Unlock()
		return false, nil
	}
	err := s.relet(sh, key, e, now.Add(ttl))
	sh.mu.Unlock()
	if err == nil {
		err = s.Sync()
	}
	return err == nil, err
}

// Extend is Renew in memory only, not recorded in the journal: the file
// store's commit holds its lease until its record is on disk, and the
// record, not the lease, is what then survives a crash.
func (s *Table) Extend(key, token string, ttl time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !now.Before(e.expires) || !dedup.IsLease(e.val, token) {
		return false
	}
	e.expires = now.Add(ttl)
	sh.m[key] = e
	return true
}

// Commit sets key to the done record rec (memory store: no journal),
// replacing whatever it held, a mark too, and reports whether it held
// token's lease (live, or its mark: no other attempt took it over).
func (s *Table) Commit(key, token, rec string, retention time.Duration) bool {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	held := ok && dedup.IsLease(e.val, token)
	sh.m[key] = memEntry{val: rec, expires: now.Add(retention)}
	return held
}

// Settle drops key's lease once its done record is elsewhere (the file
// store's disk): token's lease (live or its mark), or anyone's mark (a
// commit replaces it); another token's live lease stays. It reports
// whether key held token's lease.
func (s *Table) Settle(key, token string) (bool, error) {
	return s.settle(key, token, true)
}

// SettleWritten is Settle for a store that deleted token's lease from
// the journal's data itself, in the write of the done record: the drop
// is not recorded in the journal. It is called where the write that
// deleted the lease ran (the file store's writer, before it takes the
// journal's changes again): a change of key still pending in the journal
// (a renewal, a claim after a release, racing the commit) was written
// after that deletion, and lands behind it, so then the drop is recorded
// in the journal, as Settle does.
func (s *Table) SettleWritten(key, token string) (bool, error) {
	return s.settle(key, token, false)
}

func (s *Table) settle(key, token string, journal bool) (bool, error) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.settles.Add(1)
	e, ok := s.get(sh, key, now)
	if !ok || !e.lease() {
		return false, nil
	}
	ours := dedup.IsLease(e.val, token)
	if !ours && now.Before(e.expires) {
		return false, nil
	}
	if !journal && ours && !s.pending(key) {
		delete(sh.m, key)
		return true, nil
	}
	if err := s.drop(sh, key); err != nil {
		return false, err
	}
	return ours, nil
}

// Settles returns a count that every Settle of key (and of the other
// keys of its shard) raises before it drops a lease. A store whose
// commit writes its record elsewhere and then settles (the file store)
// notes it before a claim reads the record, and asks SettledSince once
// the claim has taken the lease: if no record of key was landing and no
// Settle of its shard ran in between, what the read found still holds
// and the claim needs no second read. The keys of a shard (a 64th of
// them) share the count: a change says only that a second read is
// needed.
func (s *Table) Settles(key string) uint64 {
	return s.shard(key).settles.Load()
}

// Landing and Landed bracket a record of key on its way to the store's
// disk: Landing before it can be read there, Landed after its Settle
// (or its failure). In between, SettledSince reports true for key.
func (s *Table) Landing(key string) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.landing == nil {
		sh.landing = make(map[string]int)
	}
	sh.landing[key]++
}

// Landed: see Landing.
func (s *Table) Landed(key string) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.landing[key]--; sh.landing[key] <= 0 {
		delete(sh.landing, key)
	}
}

// SettledSince reports whether a record of key may have landed since
// Settles returned n: one is landing, or a Settle of the shard ran. A
// record that lands is counted landing before it can be read, and its
// Settle runs before it is counted landed: if it landed after the read
// that followed Settles, one of the two shows here.
func (s *Table) SettledSince(key string, n uint64) bool {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.landing[key] > 0 || sh.settles.Load() != n
}

// pending reports whether the journal has a change of key still pending
// (Journal.Pending); never without a journal. Called under key's shard
// lock.
func (s *Table) pending(key string) bool {
	return s.journal != nil && s.journal.Pending(key)
}

// HoldsOnce reports whether key holds token's lease (live or its mark),
// and whether that lease was its key's only write to the journal since
// the key's last deletion there: then
// the lease can be deleted with Pebble's SingleDelete (the file store's
// commit), which leaves nothing once it meets that write, where a
// deletion travels down to the last level. A lease renewed, taken over
// from a mark, or taken back at the store's start is not (it may have
// two writes behind it: SingleDelete would delete only the last one).
// once is reported true once per write: a second deletion of that write
// (two commits of one token racing) must be a Delete, since two
// SingleDeletes cannot share one write. The caller's write carries the
// journal's changes recorded so far, or follows them; a change of key
// still pending in the journal (Journal.Pending) is a later write, which
// lands after the caller's deletion: then once is false.
func (s *Table) HoldsOnce(key, token string) (held, once bool) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !dedup.IsLease(e.val, token) {
		return false, false
	}
	if s.pending(key) {
		// Written again (or released and taken again) since the write
		// that asks took the journal's changes: that change lands
		// after this one.
		return true, false
	}
	if once = e.once; once {
		e.once = false
		sh.m[key] = e
	}
	return true, once
}

// Release deletes token's lease on key, live or its mark (a release
// leaves no mark: the attempt's fate is known), and reports whether it
// did.
func (s *Table) Release(key, token string) (bool, error) {
	sh := s.shard(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := s.get(sh, key, now)
	if !ok || !dedup.IsLease(e.val, token) {
		return false, nil
	}
	if err := s.drop(sh, key); err != nil {
		return false, err
	}
	return true, nil
}

// Sweep deletes every entry past its time (a mark past MarkFor) and
// returns how many it deleted. Leases it cannot delete from the journal
// stay for the next sweep.
func (s *Table) Sweep() int {
	n := 0
	now := s.now()
	var leases []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		leases = leases[:0]
		for k, e := range sh.m {
			if e.kept(now) {
				continue
			}
			if e.lease() && s.journal != nil {
				leases = append(leases, k)
				continue
			}
			delete(sh.m, k)
			n++
		}
		if len(leases) > 0 && s.journal.Delete(leases...) == nil {
			for _, k := range leases {
				delete(sh.m, k)
			}
			n += len(leases)
		}
		sh.mu.Unlock()
	}
	return n
}

func (s *Table) sweeper(every time.Duration) {
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
func (s *Table) Destruct() error {
	close(s.stop)
	<-s.done
	return nil
}

// Put sets key to val until expires, whatever it held, without telling
// the journal (the file store taking back the leases it has on disk).
func (s *Table) Put(key, val string, expires time.Time) {
	sh := s.shard(key)
	sh.mu.Lock()
	sh.m[key] = memEntry{val: val, expires: expires}
	sh.mu.Unlock()
}

// Len counts the entries, past their time or not.
func (s *Table) Len() int {
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
var _ caddy.Destructor = (*Table)(nil)
