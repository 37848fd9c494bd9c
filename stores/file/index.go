package file

import (
	"hash/maphash"
	"sync"
)

// doneIndex is the in-memory index of the done records in the file,
// loaded at open and kept in step by the writer: a 64-bit hash of each
// key (maphash, with a seed of this process's) to the latest expiry of
// the records with that hash, 16 bytes a record in the map (about 20 to
// 40 bytes of memory with the map's free slots).
//
// It answers "may key have a live done record?": no means no (a claim
// of a new event opens no transaction); yes means "read the file", which
// says whether and what (a duplicate needs its stored value, and two keys
// may share a hash). The file stays the one truth: the index only ever
// errs towards a read.
//
// The writer alone changes it, after a transaction is on disk and before
// the leases of that transaction's commits are dropped: a claim that
// sees a commit's lease gone sees its record in the index.
type doneIndex struct {
	seed maphash.Seed
	mu   sync.RWMutex
	m    map[uint64]uint64 // hash -> latest expiry, Unix nanoseconds
	// forgotten are the hashes of records deleted by a forget: another
	// key may share one, so each stays until its expiry has passed, when
	// the sweep drops it (as it drops those of the records it deletes).
	forgotten []uint64
}

func newDoneIndex() *doneIndex {
	return &doneIndex{seed: maphash.MakeSeed(), m: make(map[uint64]uint64)}
}

func (ix *doneIndex) hash(key string) uint64 { return maphash.String(ix.seed, key) }

// mayBeDone reports whether key may have a done record that has not
// expired at now (Unix nanoseconds).
func (ix *doneIndex) mayBeDone(key string, now uint64) bool {
	h := ix.hash(key)
	ix.mu.RLock()
	exp, ok := ix.m[h]
	ix.mu.RUnlock()
	return ok && exp > now
}

// len is the number of hashes in the index.
func (ix *doneIndex) len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.m)
}

// add records a key's hash and expiry (the caller holds mu, or is the
// loader at open).
func (ix *doneIndex) add(h, exp uint64) {
	if old, ok := ix.m[h]; !ok || exp > old {
		ix.m[h] = exp
	}
}

// indexChanges are the changes to the index that one write transaction
// makes, applied once it is on disk.
type indexChanges struct {
	added   []hashExp // records written
	swept   []uint64  // hashes of records the sweep deleted
	forgot  []uint64  // hashes of records a forget deleted
	sweepAt uint64    // the sweep's now, if it swept
}

type hashExp struct{ h, exp uint64 }

func (c *indexChanges) reset() {
	c.added, c.swept, c.forgot, c.sweepAt = c.added[:0], c.swept[:0], c.forgot[:0], 0
}

// apply makes the changes of a transaction that is on disk.
func (ix *doneIndex) apply(c *indexChanges) {
	if len(c.added) == 0 && len(c.forgot) == 0 && c.sweepAt == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, a := range c.added {
		ix.add(a.h, a.exp)
	}
	ix.forgotten = append(ix.forgotten, c.forgot...)
	if c.sweepAt == 0 {
		return
	}
	// A hash whose latest expiry has passed has no live record: every
	// record with that hash has expired, whether or not it is still in
	// the file, so dropping it never hides a live one.
	for _, h := range c.swept {
		if exp, ok := ix.m[h]; ok && exp <= c.sweepAt {
			delete(ix.m, h)
		}
	}
	kept := ix.forgotten[:0]
	for _, h := range ix.forgotten {
		if exp, ok := ix.m[h]; ok && exp <= c.sweepAt {
			delete(ix.m, h)
		} else if ok {
			kept = append(kept, h)
		}
	}
	ix.forgotten = kept
}
