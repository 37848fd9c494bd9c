package file

import (
	"bytes"
	"errors"
	"hash/maphash"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// A done record's lookup takes one of two ways through Pebble:
//
//   - A key that this process committed recently is looked up with
//     DB.Get, which stops at the first level that holds it: a duplicate
//     sent again soon after its first delivery is found in the
//     memtable, or a level above the last.
//   - Any other key (above all a new event's, found nowhere) with an
//     iterator that asks every level's bloom filter, the last level's
//     too (IterOptions.UseL6Filters). DB.Get never asks the last
//     level's filters: it reads that level's index blocks and a data
//     block for every key it does not find above, and at 26 M records
//     those blocks, 1.4 GiB of the 1.6, are not in the block cache.
//     With the filters a new key's lookup reads no block of the last
//     level in about 99 cases in 100 (10 bits per key).
//
// Both read the same database at the moment of the lookup and give the
// same answer: recentKeys only chooses the way, never the answer, so a
// key it forgets or mistakes costs time, not correctness.

// lookup returns the raw value of the done record's key k (a 'd' key),
// a copy. (get calls it, and recovers from its panics.)
func (st *shared) lookup(k []byte) (v []byte, ok bool, err error) {
	if st.recent.has(k) {
		return st.lookupGet(k)
	}
	st.filteredReads.Add(1)
	it, err := st.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return nil, false, st.readErr(err)
	}
	// Closed on the way out, also when a damaged block panics (get
	// recovers): an iterator left open holds its tables.
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			v, ok, err = nil, false, st.readErr(cerr)
		}
	}()
	// With Pebble's default Comparer a key's prefix is the whole key:
	// SeekPrefixGE finds k itself, or nothing.
	if it.SeekPrefixGE(k) && bytes.Equal(it.Key(), k) {
		raw, err := it.ValueAndErr()
		if err != nil {
			return nil, false, st.readErr(err)
		}
		return bytes.Clone(raw), true, nil
	}
	return nil, false, nil
}

// lookupGet returns the raw value of k through DB.Get, a copy.
func (st *shared) lookupGet(k []byte) (v []byte, ok bool, err error) {
	raw, closer, err := st.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, st.readErr(err)
	}
	v = bytes.Clone(raw)
	closer.Close()
	return v, true, nil
}

// recentBuckets is the number of recentKeys' buckets, of 4 keys each:
// 1 MiB. Once full (after some 260,000 commits), a full bucket gives up
// a slot at random, so a key committed n commits ago is still there
// with a chance of about e^(-n/262,144): 89 % of the keys of a 16 MiB
// memtable (some 60,000 events; 80 % of its oldest), 91 % of the last
// 50,000, 70 % of the last 200,000. (At 100 events a second, 50,000 is
// over 8 minutes.)
const recentBuckets = 1 << 16

// recentKeys remembers, by a tag of 31 bits of a hash, the done keys
// this process wrote lately (txn.set, the writer's one writer of
// records), to look them up with DB.Get (see lookup). A bucket forgets
// a key when a fifth key lands in it; a lookup of another key with the
// same bucket and tag (4 in 2^31) takes DB.Get. Either error only
// changes the way a lookup takes.
type recentKeys struct {
	seed    maphash.Seed
	buckets [recentBuckets][4]atomic.Uint32
	next    atomic.Uint32 // the slot a full bucket gives up next
}

func newRecentKeys() *recentKeys { return &recentKeys{seed: maphash.MakeSeed()} }

func (r *recentKeys) slot(k []byte) (b *[4]atomic.Uint32, tag uint32) {
	h := maphash.Bytes(r.seed, k)
	return &r.buckets[h&(recentBuckets-1)], uint32(h>>32) | 1 // never 0, an empty slot
}

// mark remembers the done key k.
func (r *recentKeys) mark(k []byte) {
	b, tag := r.slot(k)
	for i := range b {
		switch b[i].Load() {
		case tag:
			return
		case 0:
			if b[i].CompareAndSwap(0, tag) {
				return
			}
		}
	}
	b[r.next.Add(1)&3].Store(tag)
}

// has reports whether k was marked lately.
func (r *recentKeys) has(k []byte) bool {
	b, tag := r.slot(k)
	return b[0].Load() == tag || b[1].Load() == tag || b[2].Load() == tag || b[3].Load() == tag
}
