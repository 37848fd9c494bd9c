// Command engines compares, at the store level and side by side in one
// run, the storage engines the file store could use, on the operations
// the dedup file store does (see bench/ENGINES.md for the table and
// the command). It is a module of its own so that Pebble and Badger
// never enter the plugin's go.mod.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	badger "github.com/dgraph-io/badger/v4"
	bolt "go.etcd.io/bbolt"
)

// engine is what the file store needs of its storage: a durable write
// (commit: many callers, each returns once its own write is on disk),
// a durable insert-if-absent (claim), a read (duplicate lookup), and
// deleting what expired.
type engine interface {
	commit(key string, val []byte, exp time.Time) error
	claim(key string, val []byte, exp time.Time) (bool, error)
	lookup(key string, now time.Time) (bool, error)
	// load writes without waiting for the disk (building a data set)
	load(keys []string, val []byte, exp []time.Time) error
	sweep(now time.Time) (int, error)
	close() error
}

func record(exp time.Time, val []byte) []byte {
	b := make([]byte, 8+len(val))
	binary.BigEndian.PutUint64(b, uint64(exp.UnixNano()))
	copy(b[8:], val)
	return b
}

func live(raw []byte, now time.Time) bool {
	return len(raw) >= 8 && binary.BigEndian.Uint64(raw) > uint64(now.UnixNano())
}

// index is the in-memory index of live records: key to expiry.
type index struct {
	mu sync.RWMutex
	m  map[string]int64
}

func (x *index) get(key string, now time.Time) bool {
	x.mu.RLock()
	e, ok := x.m[key]
	x.mu.RUnlock()
	return ok && e > now.UnixNano()
}

func (x *index) set(key string, exp time.Time) {
	x.mu.Lock()
	x.m[key] = exp.UnixNano()
	x.mu.Unlock()
}

// locks makes an engine's read-then-write claim atomic in the process,
// as the file store's lock on the file makes it the only writer.
type locks struct{ mu [64]sync.Mutex }

func (l *locks) of(key string) *sync.Mutex {
	var h uint32 = 2166136261
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &l.mu[h%64]
}

// ---- bbolt, with the file store's writer: one goroutine takes every
// waiting write into one transaction (at most maxBatch), commits it
// (fsync) and answers each.

type boltOp struct {
	fn   func(ev, exp *bolt.Bucket) error
	done chan error
}

type boltEngine struct {
	db       *bolt.DB
	ops      chan *boltOp
	maxBatch int
	expiry   bool   // keep the expiry index bucket (today's layout)
	idx      *index // tuned: the in-memory index of live records
	wg       sync.WaitGroup
}

var (
	bEvents = []byte("events")
	bExpiry = []byte("expiry")
)

func openBolt(dir string, tuned bool) (*boltEngine, error) {
	opts := &bolt.Options{Timeout: time.Nanosecond, FreelistType: bolt.FreelistMapType}
	if tuned {
		opts.NoFreelistSync = true
	}
	db, err := bolt.Open(filepath.Join(dir, "dedup.db"), 0o600, opts)
	if err != nil {
		return nil, err
	}
	e := &boltEngine{db: db, ops: make(chan *boltOp), maxBatch: 1024, expiry: !tuned}
	if tuned {
		e.maxBatch = 8192
		e.idx = &index{m: map[string]int64{}}
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bEvents)
		if err == nil && e.expiry {
			_, err = tx.CreateBucketIfNotExists(bExpiry)
		}
		return err
	})
	if err == nil && tuned {
		// the index of done records, loaded at start
		err = db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bEvents).ForEach(func(k, v []byte) error {
				if len(v) >= 8 {
					e.idx.m[string(k)] = int64(binary.BigEndian.Uint64(v))
				}
				return nil
			})
		})
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	e.wg.Add(1)
	go e.writer()
	return e, nil
}

func (e *boltEngine) writer() {
	defer e.wg.Done()
	batch := make([]*boltOp, 0, e.maxBatch)
	for op := range e.ops {
		batch = append(batch[:0], op)
	more:
		for len(batch) < e.maxBatch {
			select {
			case op, ok := <-e.ops:
				if !ok {
					break more
				}
				batch = append(batch, op)
			default:
				break more
			}
		}
		errs := make([]error, len(batch))
		err := e.db.Update(func(tx *bolt.Tx) error {
			ev, exp := tx.Bucket(bEvents), tx.Bucket(bExpiry)
			for i, op := range batch {
				errs[i] = op.fn(ev, exp)
			}
			return nil
		})
		for i, op := range batch {
			if err != nil {
				errs[i] = err
			}
			op.done <- errs[i]
		}
	}
}

func (e *boltEngine) write(fn func(ev, exp *bolt.Bucket) error) error {
	op := &boltOp{fn: fn, done: make(chan error, 1)}
	e.ops <- op
	return <-op.done
}

func expiryKey(exp uint64, key string) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, exp)
	copy(k[8:], key)
	return k
}

// put is today's put: unindex the old expiry, write the record and its
// expiry index entry; tuned: the record only.
func (e *boltEngine) put(ev, ex *bolt.Bucket, key string, val []byte, exp time.Time) error {
	if e.expiry {
		if raw := ev.Get([]byte(key)); len(raw) >= 8 {
			if err := ex.Delete(expiryKey(binary.BigEndian.Uint64(raw), key)); err != nil {
				return err
			}
		}
		if err := ex.Put(expiryKey(uint64(exp.UnixNano()), key), nil); err != nil {
			return err
		}
	}
	return ev.Put([]byte(key), record(exp, val))
}

func (e *boltEngine) commit(key string, val []byte, exp time.Time) error {
	err := e.write(func(ev, ex *bolt.Bucket) error { return e.put(ev, ex, key, val, exp) })
	if err == nil && e.idx != nil {
		e.idx.set(key, exp)
	}
	return err
}

func (e *boltEngine) claim(key string, val []byte, exp time.Time) (bool, error) {
	now := time.Now()
	if e.idx != nil && e.idx.get(key, now) {
		return false, nil // known done: no transaction
	}
	won := false
	err := e.write(func(ev, ex *bolt.Bucket) error {
		if live(ev.Get([]byte(key)), now) {
			return nil
		}
		won = true
		return e.put(ev, ex, key, val, exp)
	})
	return won, err
}

func (e *boltEngine) lookup(key string, now time.Time) (bool, error) {
	if e.idx != nil {
		return e.idx.get(key, now), nil
	}
	var ok bool
	err := e.db.View(func(tx *bolt.Tx) error {
		ok = live(tx.Bucket(bEvents).Get([]byte(key)), now)
		return nil
	})
	return ok, err
}

func (e *boltEngine) load(keys []string, val []byte, exp []time.Time) error {
	e.db.NoSync = true
	defer func() { e.db.NoSync = false }()
	err := e.db.Update(func(tx *bolt.Tx) error {
		ev, ex := tx.Bucket(bEvents), tx.Bucket(bExpiry)
		for i, k := range keys {
			if err := e.put(ev, ex, k, val, exp[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && e.idx != nil {
		for i, k := range keys {
			e.idx.set(k, exp[i])
		}
	}
	return err
}

func (e *boltEngine) sweep(now time.Time) (int, error) {
	var keys [][]byte
	if e.idx != nil { // tuned: the expired keys come from the index
		e.idx.mu.Lock()
		for k, x := range e.idx.m {
			if x <= now.UnixNano() {
				keys = append(keys, []byte(k))
				delete(e.idx.m, k)
			}
		}
		e.idx.mu.Unlock()
	}
	n := 0
	for {
		d := 0
		err := e.db.Update(func(tx *bolt.Tx) error {
			ev := tx.Bucket(bEvents)
			if e.idx != nil {
				for d < 500 && len(keys) > 0 {
					if err := ev.Delete(keys[0]); err != nil {
						return err
					}
					keys, d = keys[1:], d+1
				}
				return nil
			}
			ex := tx.Bucket(bExpiry)
			c := ex.Cursor()
			var del [][]byte
			for k, _ := c.First(); k != nil && len(del) < 500 && binary.BigEndian.Uint64(k) <= uint64(now.UnixNano()); k, _ = c.Next() {
				del = append(del, append([]byte(nil), k...))
			}
			for _, k := range del {
				if err := ex.Delete(k); err != nil {
					return err
				}
				if err := ev.Delete(k[8:]); err != nil {
					return err
				}
			}
			d = len(del)
			return nil
		})
		n += d
		if err != nil || d < 500 {
			return n, err
		}
	}
}

func (e *boltEngine) close() error {
	close(e.ops)
	e.wg.Wait()
	return e.db.Close()
}

// ---- Pebble: every write a batch committed with Sync; Pebble's commit
// pipeline groups the WAL syncs of concurrent committers itself.

type pebbleEngine struct {
	db *pebble.DB
	l  locks
}

func openPebble(dir string) (*pebbleEngine, error) {
	db, err := pebble.Open(filepath.Join(dir, "pebble"), &pebble.Options{Logger: quiet{}})
	if err != nil {
		return nil, err
	}
	return &pebbleEngine{db: db}, nil
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(f string, a ...any) {
	panic(fmt.Sprintf(f, a...))
}

func (e *pebbleEngine) commit(key string, val []byte, exp time.Time) error {
	return e.db.Set([]byte(key), record(exp, val), pebble.Sync)
}

func (e *pebbleEngine) claim(key string, val []byte, exp time.Time) (bool, error) {
	m := e.l.of(key)
	m.Lock()
	defer m.Unlock()
	if ok, err := e.lookup(key, time.Now()); ok || err != nil {
		return false, err
	}
	return true, e.commit(key, val, exp)
}

func (e *pebbleEngine) lookup(key string, now time.Time) (bool, error) {
	v, c, err := e.db.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer c.Close()
	return live(v, now), nil
}

func (e *pebbleEngine) load(keys []string, val []byte, exp []time.Time) error {
	b := e.db.NewBatch()
	for i, k := range keys {
		_ = b.Set([]byte(k), record(exp[i], val), nil)
	}
	return b.Commit(pebble.NoSync)
}

// sweep scans every record (no expiry index: a second key per record
// would double the writes) and deletes the expired ones.
func (e *pebbleEngine) sweep(now time.Time) (int, error) {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return 0, err
	}
	b := e.db.NewBatch()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		if !live(it.Value(), now) {
			_ = b.Delete(append([]byte(nil), it.Key()...), nil)
			n++
		}
	}
	if err := it.Close(); err != nil {
		return 0, err
	}
	return n, b.Commit(pebble.NoSync)
}

func (e *pebbleEngine) close() error { return e.db.Close() }

// ---- Badger: SyncWrites (each update returns once on disk; Badger
// groups concurrent writes into one write of its value log), expiry by
// its per-entry TTL.

type badgerEngine struct {
	db *badger.DB
	l  locks
}

func openBadger(dir string) (*badgerEngine, error) {
	o := badger.DefaultOptions(filepath.Join(dir, "badger")).WithSyncWrites(true).WithLogger(nil)
	db, err := badger.Open(o)
	if err != nil {
		return nil, err
	}
	return &badgerEngine{db: db}, nil
}

func (e *badgerEngine) commit(key string, val []byte, exp time.Time) error {
	return e.db.Update(func(tx *badger.Txn) error {
		en := badger.NewEntry([]byte(key), val)
		en.ExpiresAt = uint64(exp.Unix())
		return tx.SetEntry(en)
	})
}

func (e *badgerEngine) claim(key string, val []byte, exp time.Time) (bool, error) {
	won := false
	err := e.db.Update(func(tx *badger.Txn) error { // serializable: conflicts abort
		if _, err := tx.Get([]byte(key)); err == nil {
			return nil
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		won = true
		en := badger.NewEntry([]byte(key), val)
		en.ExpiresAt = uint64(exp.Unix())
		return tx.SetEntry(en)
	})
	return won, err
}

func (e *badgerEngine) lookup(key string, _ time.Time) (bool, error) {
	ok := false
	err := e.db.View(func(tx *badger.Txn) error {
		_, err := tx.Get([]byte(key))
		ok = err == nil
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		return err
	})
	return ok, err
}

func (e *badgerEngine) load(keys []string, val []byte, exp []time.Time) error {
	wb := e.db.NewWriteBatch()
	for i, k := range keys {
		en := badger.NewEntry([]byte(k), val)
		en.ExpiresAt = uint64(exp[i].Unix())
		if err := wb.SetEntry(en); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// sweep: Badger drops expired entries itself (at compaction).
func (e *badgerEngine) sweep(time.Time) (int, error) { return 0, nil }

func (e *badgerEngine) close() error { return e.db.Close() }

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// scan reads every record of e, as loading an index at start does.
func scan(e engine) (int, error) {
	n := 0
	now := time.Now()
	switch e := e.(type) {
	case *boltEngine:
		if e.idx != nil {
			e.idx.mu.RLock()
			defer e.idx.mu.RUnlock()
			for _, x := range e.idx.m {
				if x > now.UnixNano() {
					n++
				}
			}
			return n, nil
		}
		err := e.db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bEvents).ForEach(func(_, v []byte) error {
				if live(v, now) {
					n++
				}
				return nil
			})
		})
		return n, err
	case *pebbleEngine:
		it, err := e.db.NewIter(nil)
		if err != nil {
			return 0, err
		}
		for it.First(); it.Valid(); it.Next() {
			if live(it.Value(), now) {
				n++
			}
		}
		return n, it.Close()
	case *badgerEngine:
		err := e.db.View(func(tx *badger.Txn) error {
			it := tx.NewIterator(badger.IteratorOptions{PrefetchValues: false})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				n++
			}
			return nil
		})
		return n, err
	}
	return 0, fmt.Errorf("unknown engine")
}
