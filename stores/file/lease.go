package file

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// leaseWrites is how the leases reach the database. leaseSynced is the
// product; the others exist for BenchmarkFileStoreLeaseWrites, which
// measures them side by side.
var leaseWrites = leaseSynced

const (
	// leaseSynced: a claim's and a renewal's write is synced (an
	// fdatasync of Pebble's log, shared by the claims and commits that
	// wait at the same time) before they return.
	leaseSynced = iota
	// leaseNoSync: written, not synced. Not even a kill -9 is survived:
	// Pebble keeps an unsynced write in its log's buffer, in the
	// process, until a later synced write or a full 32 KiB block sends
	// it to the OS.
	leaseNoSync
	// leaseInMemory: not written at all (the releases before this one).
	leaseInMemory
)

// leaseJournal writes the leases' changes to the database, as 'l' keys
// (encodeRecord: the lease's expiry and "inflight:<token>"). memtable
// calls Set and Delete under the lock of the key's shard, so the writes
// of one key reach Pebble in the order they happened in memory (Pebble
// orders its writes as they enter its commit pipeline); they are
// written unsynced there (a few µs), and a claim or a renewal then calls
// Sync, outside the lock, so that concurrent claims share an fsync.
type leaseJournal struct{ st *shared }

func (j leaseJournal) Set(key, val string, expires time.Time) error {
	st := j.st
	st.dbMu.RLock()
	defer st.dbMu.RUnlock()
	if st.dbClosed {
		return errFileClosed
	}
	if err := st.db.Set(leaseKey(key), encodeRecord(unixNano(expires), val), pebble.NoSync); err != nil {
		return fmt.Errorf("file store: writing a lease to %s: %v", st.path, err)
	}
	return nil
}

func (j leaseJournal) Delete(keys ...string) error {
	st := j.st
	st.dbMu.RLock()
	defer st.dbMu.RUnlock()
	if st.dbClosed {
		return errFileClosed
	}
	b := st.db.NewBatch()
	defer b.Close()
	for _, k := range keys {
		if err := b.Delete(leaseKey(k), nil); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("file store: deleting a lease from %s: %v", st.path, err)
	}
	return nil
}

// Sync syncs Pebble's log up to here: every write before it, the
// caller's lease among them, is on disk when it returns. Pebble's log
// writer serves the syncs waiting at one time with one fdatasync. A disk
// that does not answer within fileWriteTimeout is an error (a claim's
// caller answers 503 rather than hold the sender); the sync goes on, and
// its lease lands when the disk answers.
func (j leaseJournal) Sync() error {
	if leaseWrites != leaseSynced {
		return nil
	}
	st, sync := j.st, syncLog
	done := make(chan error, 1)
	go func() {
		st.dbMu.RLock()
		defer st.dbMu.RUnlock()
		if st.dbClosed {
			done <- errFileClosed
			return
		}
		done <- sync(st.db)
	}()
	timer := time.NewTimer(fileWriteTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil && err != errFileClosed {
			return fmt.Errorf("file store: syncing a lease to %s: %v", st.path, err)
		}
		return err
	case <-timer.C:
		return fmt.Errorf("file store: syncing a lease to %s: %w", st.path, errFileStalled)
	}
}

// syncLog syncs Pebble's log (a test stalls it).
var syncLog = func(db *pebble.DB) error { return db.LogData(nil, pebble.Sync) }
