package file

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"
)

// The sweeper. There is no index by expiry: an index entry repeats the
// whole key, and was about a third of the store's bytes on disk. The
// sweeper reads the done records themselves, in key order, a slice
// every tick, and deletes those that have expired; a whole pass over
// the store takes at most about fileSweepPass (or the time its
// fileSweepSlice floor needs: 26 M records in 43 minutes). An expired
// record is absent to every read from the moment it expires (entry,
// record: the expiry is checked), so a late sweep costs disk, never
// correctness: a record stays on disk at most one pass after its
// expiry, about 1/72 more bytes at a 72 h retention and a 1 h pass.
var (
	// fileSweepSlice is the least number of records one tick reads
	// (10,000 a second at a tick every 10 s; a read is about a
	// microsecond of CPU and ~60 bytes of sequential disk).
	fileSweepSlice = 100_000 // a variable for the tests
	// fileSweepPass is the longest a pass over the store should take:
	// a tick reads the records of the last pass × every / fileSweepPass
	// if that is more than fileSweepSlice.
	fileSweepPass = time.Hour
)

// keySweepCursor holds the done key the sweeper's next slice starts at,
// written after each tick: a restart goes on from there, so a Caddy
// restarted more often than a pass takes still sweeps every record.
var keySweepCursor = []byte("\x00sweep_cursor")

// sweepState is where the sweeper is in its pass over the records.
type sweepState struct {
	mu       sync.Mutex // one sweep at a time
	cursor   []byte     // the done key the next slice starts at; nil: the first
	passRead int        // records read in the pass under way
	lastPass int        // records read in the last whole pass
}

// sweeper deletes expired records: first the index by expiry of the
// layout before this one, if the store has one, then a slice of the
// records every `every`.
func (st *shared) sweeper(every time.Duration) {
	defer st.wg.Done()
	if err := st.dropExpiryIndex(); err != nil && !errors.Is(err, errFileClosed) {
		st.logger.Error("removing the old expiry index failed", zap.String("path", st.path), zap.Error(err))
	}
	if v, ok, err := st.get(keySweepCursor); err == nil && ok && len(v) > 0 && v[0] == prefixDone {
		st.sw.mu.Lock()
		st.sw.cursor = v
		st.sw.mu.Unlock()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			return
		case <-t.C:
			if _, _, err := st.sweepTick(every); err != nil && !errors.Is(err, errFileClosed) {
				st.logger.Error("sweep failed", zap.String("path", st.path), zap.Error(err))
			}
		}
	}
}

// sweepTick reads the next slice of the records, and deletes those that
// have expired; it returns how many it read and deleted.
func (st *shared) sweepTick(every time.Duration) (read, deleted int, err error) {
	st.sw.mu.Lock()
	defer st.sw.mu.Unlock()
	n := max(fileSweepSlice, int(int64(st.sw.lastPass)*int64(every)/int64(fileSweepPass)))
	next, read, deleted, err := st.sweepSlice(st.sw.cursor, n)
	st.sw.passRead += read
	st.sw.cursor = next
	if next == nil && err == nil {
		st.sw.lastPass, st.sw.passRead = st.sw.passRead, 0
	}
	if werr := st.write(func(tx *txn) error { return tx.b.Set(keySweepCursor, next, nil) }); err == nil {
		err = werr
	}
	return read, deleted, err
}

// sweep runs a whole pass over the records now, and returns how many it
// deleted (tests, benchmarks).
func (st *shared) sweep() (int, error) {
	st.sw.mu.Lock()
	defer st.sw.mu.Unlock()
	total := 0
	var from []byte
	for {
		next, _, deleted, err := st.sweepSlice(from, fileSweepSlice)
		total += deleted
		if err != nil || next == nil {
			return total, err
		}
		from = next
	}
}

// sweepSlice reads up to n done records from the key from (nil: the
// first), outside the writer (commits go on meanwhile), and then
// deletes those that have expired (deleteExpired). It returns the key
// to go on from, nil at the end of the records.
func (st *shared) sweepSlice(from []byte, n int) (next []byte, read, deleted int, err error) {
	now := unixNano(st.now())
	expired, next, read, bad, err := st.readExpired(from, n, now)
	if err != nil {
		return from, read, 0, err
	}
	deleted, err = st.deleteExpired(expired)
	if err != nil {
		return from, read, deleted, err
	}
	return next, read, deleted, bad
}

// deleteExpired deletes, through the writer, fileSweepBatch per batch,
// the done records of keys that have expired when the writer takes
// them: each is checked again there, as a commit may have written it
// anew since it was read.
func (st *shared) deleteExpired(keys []string) (deleted int, err error) {
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), fileSweepBatch)]
		keys = keys[len(chunk):]
		k := 0
		if err := st.write(func(tx *txn) error {
			k = 0
			now := unixNano(tx.now)
			for _, key := range chunk {
				exp, ok, err := tx.expiry(key)
				if err != nil {
					return err
				}
				if ok && exp <= now {
					if err := tx.b.Delete(doneKey(key), nil); err != nil {
						return err
					}
					k++
				}
			}
			return nil
		}); err != nil {
			return deleted, err
		}
		deleted += k
	}
	return deleted, nil
}

// sweepReadHook, when set (by a test), runs in readExpired once its
// iterator is open (the records it reads are those of that moment),
// before it reads them.
var sweepReadHook func()

// readExpired reads up to n done records from the key from and returns
// the keys of those expired at now, and the key to go on from (nil at
// the end). A record it cannot decode is skipped, and named in bad: the
// sweep goes on past it, and logs it.
func (st *shared) readExpired(from []byte, n int, now uint64) (expired []string, next []byte, read int, bad, err error) {
	defer func() {
		if p := recover(); p != nil {
			if err = fileDamaged(st.path, p); err != errFileClosed {
				st.logger.Error("damaged store", zap.String("path", st.path), zap.Any("panic", p))
			}
		}
	}()
	if st.isClosed() {
		return nil, from, 0, nil, errFileClosed
	}
	lo := from
	if lo == nil {
		lo = []byte{prefixDone}
	}
	it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: []byte{prefixDone + 1}})
	if err != nil {
		return nil, from, 0, nil, st.readErr(err)
	}
	if sweepReadHook != nil {
		sweepReadHook()
	}
	ok := it.First()
	for ; ok && read < n; ok = it.Next() {
		read++
		v, verr := it.ValueAndErr()
		if verr != nil {
			it.Close()
			return nil, from, read, nil, st.readErr(verr)
		}
		exp, derr := decodeExpiry(v)
		if derr != nil {
			bad = fmt.Errorf("file store: reading %s: key %q: %v", st.path, it.Key()[1:], derr)
			continue
		}
		if exp <= now {
			expired = append(expired, string(it.Key()[1:]))
		}
	}
	if ok {
		next = bytes.Clone(it.Key())
	}
	if err := it.Close(); err != nil {
		return nil, from, read, nil, st.readErr(err)
	}
	return expired, next, read, bad, nil
}

// dropExpiryIndex deletes the index by expiry ('x' keys) that the
// layout before this one kept beside the records, if the store has
// one: one range deletion, through the writer.
func (st *shared) dropExpiryIndex() (err error) {
	lo, hi := []byte{prefixExpiry}, []byte{prefixExpiry + 1}
	found := false
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fileDamaged(st.path, p)
			}
		}()
		it, ierr := st.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if ierr != nil {
			err = st.readErr(ierr)
			return
		}
		found = it.First()
		if cerr := it.Close(); cerr != nil {
			err = st.readErr(cerr)
		}
	}()
	if err != nil || !found {
		return err
	}
	if err := st.write(func(tx *txn) error { return tx.b.DeleteRange(lo, hi, nil) }); err != nil {
		return err
	}
	st.logger.Info("removed the index by expiry of the earlier layout", zap.String("path", st.path),
		zap.String("note", "the sweeper reads the records themselves now"))
	return nil
}
