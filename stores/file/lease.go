package file

import (
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// leaseWrites is how the leases reach the database. leaseSynced is the
// product; the others exist for BenchmarkFileStoreLeaseWrites, which
// measures them side by side.
var leaseWrites = leaseSynced

const (
	// leaseSynced: a claim's and a renewal's write is synced (in a
	// batch of the writer: one fsync of Pebble's log, shared by the
	// claims and commits that wait at the same time) before they return.
	leaseSynced = iota
	// leaseNoSync: queued, not waited for: written by the writer's next
	// batch, whenever another write comes. Not even a kill -9 is
	// survived.
	leaseNoSync
	// leaseInMemory: not written at all (the releases before this one).
	leaseInMemory
)

// leaseJournal writes the leases' changes to the database, as 'l' keys
// (encodeRecord: the lease's expiry and "inflight:<token>"). memtable
// calls Set and Delete under the lock of the key's shard, so they queue
// the changes of one key in the order they happened in memory; the
// writer puts what is queued at the head of its next batch (in that
// order), and a claim or a renewal then calls Sync, outside the lock,
// which waits for a batch of the writer: the lease is on disk in the
// same group commit as the claims and commits waiting with it, one
// fsync for all (see leaseQueue).
type leaseJournal struct{ st *shared }

func (j leaseJournal) Set(key, val string, expires time.Time) error {
	return j.st.lq.add(leaseChange{key: key, val: val, expires: unixNano(expires)})
}

func (j leaseJournal) Delete(keys ...string) error {
	changes := make([]leaseChange, len(keys))
	for i, k := range keys {
		changes[i] = leaseChange{key: k, del: true}
	}
	return j.st.lq.add(changes...)
}

// Sync returns once every change queued before it is on disk: it waits
// for a batch of the writer (which takes the queue first), synced with
// the writes waiting with it. A disk that does not answer within
// fileWriteTimeout is an error (a claim's caller answers 503 rather
// than hold the sender); the batch goes on, and its lease lands when
// the disk answers.
func (j leaseJournal) Sync() error {
	if leaseWrites != leaseSynced {
		return nil
	}
	st := j.st
	if err := st.syncWrites(); err != nil {
		return err
	}
	// A batch that failed with the change in it (before the one that
	// synced here): the change is not on disk.
	return st.lq.failed()
}

// Pending reports whether a change of key is queued for the writer's
// next batch (called under key's shard lock, by which its changes are
// queued).
func (j leaseJournal) Pending(key string) bool { return j.st.lq.pending(key) }

// leaseChange is a lease set (val until expires) or deleted.
type leaseChange struct {
	key, val string
	expires  uint64
	del      bool
}

// leaseQueue holds the leases' changes on their way to the database.
type leaseQueue struct {
	mu      sync.Mutex
	changes []leaseChange
	closed  bool  // the database is closed (Destruct): no more changes
	err     error // a batch with changes in it failed: no more changes
}

// add queues changes, all sets or all deletions. After a failed batch
// (q.err) a set is refused, since it might not reach the disk; a
// deletion is not: the lease of a claim that failed with the batch
// must leave memory, and whether the deletion reaches the disk is
// Pebble's to say.
func (q *leaseQueue) add(changes ...leaseChange) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errFileClosed
	}
	if q.err != nil && len(changes) > 0 && !changes[0].del {
		return q.err
	}
	q.changes = append(q.changes, changes...)
	return nil
}

// pending reports whether a change of key is queued. The queue holds the
// changes since the writer's last batch took it: a few, a scan.
func (q *leaseQueue) pending(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range q.changes {
		if q.changes[i].key == key {
			return true
		}
	}
	return false
}

func (q *leaseQueue) failed() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// take returns the queued changes and empties the queue; close: for
// good (the database is closing).
func (q *leaseQueue) take(close bool) ([]leaseChange, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, errFileClosed
	}
	c := q.changes
	q.changes, q.closed = nil, close
	return c, nil
}

// fail records that a batch with changes in it failed with err: every
// later change and sync fails (Pebble's log fails for good too).
func (q *leaseQueue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		q.err = fmt.Errorf("file store: a write of the leases failed (claims are refused until Caddy restarts): %w", err)
	}
}

// deleteLease deletes key's lease in b. once (memtable.Table.HoldsOnce):
// the lease is its key's only write since the key's last deletion, so
// Pebble's SingleDelete can delete it: the two annul each other where
// they meet, most often in the flush of the memtable that holds both
// (else in a compaction of L0), and nothing of the lease is carried down
// the levels. A deletion (Delete) stays to hide whatever may lie below
// it, and travels down through the compactions: at 26 M records those
// deletions were 15-20 % of the bytes compacted per new event
// (docs/stores.md, "A committed lease leaves nothing behind").
// Otherwise Delete: a SingleDelete over two writes would delete only the
// last one, and the earlier would come back.
func deleteLease(b *pebble.Batch, key string, once bool) error {
	if once {
		return b.SingleDelete(leaseKey(key), nil)
	}
	return b.Delete(leaseKey(key), nil)
}

// writeLeases puts changes in b, in order.
func writeLeases(b *pebble.Batch, changes []leaseChange) error {
	for _, c := range changes {
		var err error
		if c.del {
			err = b.Delete(leaseKey(c.key), nil)
		} else {
			err = b.Set(leaseKey(c.key), encodeRecord(c.expires, c.val), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
