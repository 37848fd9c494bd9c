package file

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// fileOp is one write waiting for the writer.
type fileOp struct {
	fn    func(*txn) error
	after func() // run by the writer once fn's batch is on disk, if fn succeeded
	// lands is the key whose done record fn writes, if it writes one:
	// counted as landing (Table.Landing) from before the batch is
	// committed until after the op's after.
	lands string
	// sync: fn writes nothing; the op waits for a batch (a lease's
	// sync). The tests' stall hooks tell a sync from a write by it.
	sync bool
	err  error
	done chan struct{}
}

var fileOpPool = sync.Pool{New: func() any { return &fileOp{done: make(chan struct{}, 1)} }}

var errFileClosed = errors.New("file store: the store is closed (Caddy is stopping, or a reload unloaded its config)")

// isClosed reports whether Destruct has begun.
func (st *shared) isClosed() bool {
	select {
	case <-st.stop:
		return true
	default:
		return false
	}
}

// fileWriteTimeout bounds how long a write waits for the disk, so that a
// stalled fsync never holds a backend's answer back from the sender: the
// commit fails, the answer goes out, and the commit is retried.
var (
	fileWriteTimeout = 5 * time.Second
	errFileStalled   = errors.New("the disk did not complete the write in time")
	// errFileWritePending: the writer had taken the write when the time
	// ran out; it cannot be called off, and lands when the disk answers.
	errFileWritePending = fmt.Errorf("%w; the write was under way and may still land when the disk answers", errFileStalled)
)

// write runs fn in a write batch and returns once the batch
// is on disk. Concurrent writes share one batch.
func (st *shared) write(fn func(*txn) error) error {
	return st.writeThen(fn, nil)
}

// writeThen is write, and then after, run by the writer once fn's
// batch is on disk (if fn succeeded), in the order of the writes:
// whether or not the caller is still waiting (a stalled disk), and
// before any later write. A change to the leases in memory that must
// follow a write (a commit's release, a forget's) goes there.
func (st *shared) writeThen(fn func(*txn) error, after func()) error {
	return st.submit(&fileOp{fn: fn, after: after})
}

// syncWrites returns once every write queued before it (the leases'
// changes too) is on disk: it waits for a batch of the writer.
func (st *shared) syncWrites() error {
	return st.submit(&fileOp{fn: nopWrite, sync: true})
}

func nopWrite(*txn) error { return nil }

// writeRecordThen is writeThen for a write of key's done record (a
// commit): a claim of key checks the database again if one is landing
// (see Table.SettledSince).
func (st *shared) writeRecordThen(key string, fn func(*txn) error, after func()) error {
	return st.submit(&fileOp{fn: fn, after: after, lands: key})
}

// submit has the writer run w's fn, after and lands (see fileOp).
func (st *shared) submit(w *fileOp) error {
	if err := st.failure(); err != nil {
		return err
	}
	op := fileOpPool.Get().(*fileOp)
	op.fn, op.after, op.lands, op.sync, op.err = w.fn, w.after, w.lands, w.sync, nil
	timer := time.NewTimer(fileWriteTimeout)
	defer timer.Stop()
	select {
	case st.ops <- op:
	case <-st.stop:
		op.fn, op.after, op.lands, op.sync = nil, nil, "", false
		fileOpPool.Put(op)
		return errFileClosed
	case <-timer.C:
		op.fn, op.after, op.lands, op.sync = nil, nil, "", false
		fileOpPool.Put(op)
		return fmt.Errorf("file store: writing %s: %w", st.path, errFileStalled)
	}
	select {
	case <-op.done:
	case <-timer.C:
		// The writer still holds op and may yet write it: it is not
		// reused. A commit's caller retries; the write is idempotent.
		return fmt.Errorf("file store: writing %s: %w", st.path, errFileWritePending)
	}
	err := op.err
	op.fn, op.after, op.lands, op.sync, op.err = nil, nil, "", false, nil
	fileOpPool.Put(op)
	return err
}

// writer runs the writes: each batch takes every write that is waiting
// (group commit) and is committed with one fsync of the log, so a burst
// costs one fsync, and a write that is alone goes at once. The one
// writer also orders the writes: a commit's check of what is there and
// its write are one step, as are a forget's and a sweep's.
func (st *shared) writer() {
	defer st.wg.Done()
	batch := make([]*fileOp, 0, 64)
	for {
		select {
		case op := <-st.ops:
			batch = append(batch[:0], op)
		case <-st.stop:
			return
		}
	more:
		for len(batch) < fileMaxBatch {
			select {
			case op := <-st.ops:
				batch = append(batch, op)
			default:
				break more
			}
		}
		if err := st.failure(); err != nil {
			for _, op := range batch {
				op.err = err
				op.done <- struct{}{}
			}
			continue
		}
		st.txns.Add(1)
		st.writes.Add(int64(len(batch)))
		tx := txn{b: st.db.NewIndexedBatch(), now: st.now(), recent: st.recent}
		// The leases' changes queued so far go first: a claim queues its
		// lease before it sends its sync (an op) here, so the batch that
		// carries the op carries the lease, or follows the one that did.
		leases, _ := st.lq.take(false)
		if h := st.leasesTakenHook.Load(); h != nil {
			(*h)(batch)
		}
		leaseErr := writeLeases(tx.b, leases)
		for _, op := range batch {
			op.err = tx.run(st, op.fn)
			if op.err == nil && op.lands != "" {
				st.leases.Landing(op.lands) // before the record can be read
			}
		}
		err := leaseErr
		if h := st.beforeCommitHook.Load(); h != nil && err == nil {
			err = (*h)(batch, len(leases))
		}
		if err == nil {
			err = st.commitBatch(tx.b)
		}
		tx.b.Close()
		if err != nil && len(leases) > 0 {
			st.lq.fail(err)
		}
		st.reads.Add(tx.reads)
		if writerCommittedHook != nil {
			writerCommittedHook()
		}
		for _, op := range batch {
			landed := op.err == nil && op.lands != ""
			if err != nil {
				op.err = fmt.Errorf("file store: writing %s: %v", st.path, err)
			} else if op.err == nil && op.after != nil {
				op.after()
			}
			if landed {
				st.leases.Landed(op.lands) // after its Settle, or its failure
			}
			op.done <- struct{}{}
		}
	}
}

// commitBatch commits b, synced. A fatal error of Pebble's there (a write
// of its log refused: a full disk, an I/O error), which it reports by
// Logger.Fatalf, fails the store for good (fail), instead of ending the
// process and every Caddy site with it.
func (st *shared) commitBatch(b *pebble.Batch) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = st.fail(asFatal(p))
		}
	}()
	return b.Commit(pebble.Sync)
}

// writerCommittedHook, when set (by a test), runs in the writer once a
// batch is committed, before the afters of its writes.
var writerCommittedHook func()

// beforeCommitHook is shared.beforeCommitHook's type: set by a test, it
// runs in the writer once the writes of a batch and its lease changes
// (leases of them) are in the batch, before it is committed: a disk
// that holds the batch, or fails it (an error: the batch is not
// committed and fails with it).
type beforeCommitHook func(ops []*fileOp, leases int) error

// txn is the store's view of one write batch: an indexed batch, whose
// reads see the database and the batch's own writes.
type txn struct {
	b      *pebble.Batch
	now    time.Time
	reads  int64       // point reads of done records, added to shared.reads
	recent *recentKeys // the done keys written lately (see lookup)
}

// run runs fn on tx; a panic in a read of damaged data is an error.
func (tx *txn) run(st *shared, fn func(*txn) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if err = fileDamaged(st.path, p); err != errFileClosed {
				st.logger.Error("damaged store", zap.String("path", st.path), zap.Any("panic", p))
			}
		}
	}()
	if err := fn(tx); err != nil {
		if pebble.IsCorruptionError(err) {
			return fileDamaged(st.path+" (folder "+st.dir+")", err)
		}
		return err
	}
	return nil
}

// record returns the expiry and value of key's done record, if it has
// one (live or expired).
func (tx *txn) record(key string) (exp uint64, val string, ok bool, err error) {
	return tx.decode(key, decodeRecord)
}

// expiry returns the expiry of key's done record, if it has one,
// without decoding its value.
func (tx *txn) expiry(key string) (exp uint64, ok bool, err error) {
	exp, _, ok, err = tx.decode(key, func(raw []byte) (uint64, string, error) {
		exp, err := decodeExpiry(raw)
		return exp, "", err
	})
	return exp, ok, err
}

func (tx *txn) decode(key string, dec func([]byte) (uint64, string, error)) (exp uint64, val string, ok bool, err error) {
	tx.reads++
	raw, closer, err := tx.b.Get(doneKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, "", false, nil
	}
	if err != nil {
		return 0, "", false, err
	}
	defer closer.Close()
	exp, val, err = dec(raw)
	if err != nil {
		return 0, "", false, fmt.Errorf("key %q: %w", key, err)
	}
	return exp, val, true, nil
}

// put sets key to the done record val for ttl.
func (tx *txn) put(key, val string, ttl time.Duration) error {
	_, err := tx.replace(key, doneValueOf(val), ttl)
	return err
}

// replace is set, and reports whether key held the same record, live,
// before.
func (tx *txn) replace(key string, val doneValue, ttl time.Duration) (same bool, err error) {
	old, oldVal, ok, err := tx.record(key)
	if err != nil {
		return false, err
	}
	same = ok && unixNano(tx.now) < old && oldVal == val.str()
	return same, tx.set(key, val, ttl)
}

// set sets key to the done record val for ttl, whatever it held, and
// marks it written lately: a duplicate soon after finds it in the
// memtable (see lookup).
func (tx *txn) set(key string, val doneValue, ttl time.Duration) error {
	k := doneKey(key)
	tx.recent.mark(k)
	return tx.b.Set(k, val.encode(unixNano(tx.now.Add(ttl))), nil)
}

// forget deletes key's done record if it is live, and returns it.
func (tx *txn) forget(key string) (dedup.Entry, error) {
	exp, val, ok, err := tx.record(key)
	if err != nil || !ok || unixNano(tx.now) >= exp {
		return dedup.Entry{}, err // an expired one is the sweeper's
	}
	if err := tx.b.Delete(doneKey(key), nil); err != nil {
		return dedup.Entry{}, err
	}
	return dedup.Entry{Value: val, ExpiresAt: unixTime(exp)}, nil
}
