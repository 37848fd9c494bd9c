// Package file is the default sangho_dedup store: an embedded database
// file (bbolt), durable and safe for one Caddy process at a time (module
// http.sangho_dedup.stores.file).
package file

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/internal/memstate"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Store keeps dedup state in one file on this machine's disk, an
// embedded transactional key/value database (bbolt, as used by etcd). It
// is the default store: durable across restarts, upgrades, crashes and
// power cuts with no server to run, for a single Caddy instance.
//
// A done record is on disk (fsync) before its commit returns.
// Concurrent commits share one transaction and one fsync (group commit),
// so a burst does not cost one disk flush per event. A duplicate is
// answered from a read-only transaction. Leases (events in flight) are
// kept in memory, which is safe because the file is locked by this one
// process: a crash loses them, exactly as if they had expired, and a
// clean stop keeps them in the file for the next start.
//
// The file is locked by the process that opens it: a second Caddy
// pointed at the same file refuses to start. Config reloads share the
// open file. Expired done records are swept in small batches every 10
// seconds, so the file stops growing once events expire as fast as they
// arrive (freed pages are reused).
type Store struct {
	// Path of the database file. Relative paths are relative to Caddy's
	// working directory. Default: sangho_dedup/dedup.db in Caddy's data
	// directory ($XDG_DATA_HOME/caddy, else ~/.local/share/caddy on
	// Linux). The folder is created with mode 0700, the file with 0600.
	Path string `json:"path,omitempty"`

	state  *fileState
	path   string
	logger *zap.Logger
	pooled bool
	users  *storepool.Users // deliveries and commit retries that may still need the file
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.file",
		New: func() caddy.Module { return new(Store) },
	}
}

// DefaultFilePath is where the file store keeps its database when no
// path is configured.
func DefaultFilePath() string {
	return filepath.Join(caddy.AppDataDir(), "sangho_dedup", "dedup.db")
}

// Provision opens the database file, or shares the one this process
// already opened for an earlier config.
func (s *Store) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	p := s.Path
	if p == "" {
		p = DefaultFilePath()
	} else {
		// An unset placeholder is an error, not an empty piece of the
		// path: {env.BASE}/{env.SUB}/dedup.db must not quietly become
		// another, empty database.
		var err error
		if p, err = caddy.NewReplacer().ReplaceOrErr(p, true, true); err != nil {
			return fmt.Errorf("file store: path %q: %v", s.Path, err)
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return fmt.Errorf("file store: path %q: %v", p, err)
	}
	abs = resolvePath(abs) // one open file per file, whatever the name it is reached by
	s.path = abs
	if validating() {
		// `caddy validate` checks the file without creating, locking or
		// writing anything: the file may be the running Caddy's, or
		// belong to the user Caddy runs as.
		return s.checkForValidation()
	}
	v, _, err := storepool.Pool.LoadOrNew(filePoolKey(abs), func() (caddy.Destructor, error) {
		return openFileState(abs, time.Now, fileSweepEvery, s.logger)
	})
	if err != nil {
		return err
	}
	s.pooled = true
	s.users = new(storepool.Users)
	s.state = v.(*fileState)
	return nil
}

// Cleanup releases this config's use of the file; it is closed when no
// config uses it any more.
func (s *Store) Cleanup() error {
	if !s.pooled {
		return nil
	}
	return s.users.Release(filePoolKey(s.path), s.logger)
}

// Enter implements dedup.Drainer.
func (s *Store) Enter() {
	if s.users != nil {
		s.users.Enter()
	}
}

// Leave implements dedup.Drainer.
func (s *Store) Leave() {
	if s.users != nil {
		s.users.Leave()
	}
}

// ParkAtExit implements dedup.ExitParker: it parks the live leases of
// every file still open in this process (see parkOpenFiles).
func (*Store) ParkAtExit() { parkOpenFiles() }

// resolvePath returns the real path of the database file at abs, every
// symlink resolved, the file's own name included: two routes that reach
// one file by different names share one open file (bbolt's lock would
// refuse the second open). A symlink to a file not created yet is
// followed to where the file will be; for a name that does not exist,
// its folder is resolved.
func resolvePath(abs string) string {
	for range 40 { // as many links as Linux follows
		if p, err := filepath.EvalSymlinks(abs); err == nil {
			return p
		}
		fi, err := os.Lstat(abs)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			break
		}
		target, err := os.Readlink(abs)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(abs), target)
		}
		abs = target
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

func filePoolKey(abs string) string { return "sangho_dedup.file." + abs }

// checkForValidation checks an existing file read-only (a shared lock,
// tried once): damage is an error; a file that the running Caddy holds
// is fine. A file that does not exist yet is created by `caddy run`.
func (s *Store) checkForValidation() error {
	if _, err := os.Stat(s.path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := checkFileSize(s.path); err != nil {
		return err
	}
	db, err := bolt.Open(s.path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Nanosecond})
	if errors.Is(err, bolterrors.ErrTimeout) {
		s.logger.Info("database file in use, not opened for validation", zap.String("path", s.path))
		return nil
	}
	if err != nil {
		return fileOpenError(s.path, err)
	}
	defer db.Close()
	return checkFileDB(db, s.path)
}

// validating reports whether this process is `caddy validate` (or
// `caddy adapt --validate`), which provisions a config without running
// it: the only case where a database file locked by another process is
// not an error.
func validating() bool {
	if len(os.Args) < 2 {
		return false
	}
	switch os.Args[1] {
	case "validate":
		return true
	case "adapt":
		for _, a := range os.Args[2:] {
			if a == "--validate" || a == "-validate" || a == "--validate=true" {
				return true
			}
		}
	}
	return false
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store file [<path>]
//	store file {
//		path <path>
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if d.NextArg() {
		s.Path = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "path":
			if s.Path != "" {
				return d.Err("file store: path given more than once")
			}
			if err := cfargs.One(d, &s.Path); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized file store option %q", d.Val())
		}
	}
	return nil
}

// errStoreNotOpen is what a store that was only validated, or not
// provisioned, answers.
var errStoreNotOpen = errors.New("file store: the database file is not open")

func (s *Store) st() (*fileState, error) {
	if s.state == nil {
		return nil, errStoreNotOpen
	}
	return s.state, nil
}

// Claim implements Store. The file holds done records only; leases
// live in memory (see fileState).
func (s *Store) Claim(_ context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	st, err := s.st()
	if err != nil {
		return 0, "", err
	}
	// The index says which keys may have a done record: a new event's
	// claim opens no transaction; a duplicate reads its record.
	if val, done, err := st.lookup(key); err != nil || done {
		return dedup.AlreadyDone, val, err
	}
	if res, val := st.leases.Claim(key, token, ttl); res != dedup.Claimed {
		return res, val, nil
	}
	// A store closed meanwhile (its config cleaned up and its last
	// delivery done) refuses the claim: its commit could not land, and
	// an event processed without its record would be processed again.
	// (The index answers without the file, which would have said so.)
	if st.isClosed() {
		st.leases.Release(key, token)
		return 0, "", errFileClosed
	}
	// A commit puts its record in the file and the index before it drops
	// its lease: if one did both since the lookup above, it is there now.
	if val, done, err := st.lookup(key); err != nil || done {
		st.leases.Release(key, token)
		if err != nil {
			return 0, "", err
		}
		return dedup.AlreadyDone, val, nil
	}
	return dedup.Claimed, "", nil
}

// Renew implements Store.
func (s *Store) Renew(_ context.Context, key, token string, ttl time.Duration) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	return st.leases.Renew(key, token, ttl), nil
}

// Commit implements Store: the done record is on disk when it returns;
// then the lease is dropped.
func (s *Store) Commit(_ context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	enc := rec.Encode()
	// Until the record is on disk the event stays leased, however long
	// the disk takes (the lease is dropped once the record lands, or
	// expires after the commit retries give up): a redelivery meanwhile
	// gets 409, never a second processing.
	st.leases.Renew(key, token, dedup.DrainFor)
	var again, released bool
	err = st.writeThen(func(tx *fileTx) error {
		var err error
		again, err = tx.replace(key, enc, retention) // a retried commit whose first attempt landed
		return err
	}, func() {
		// Dropped by the writer as soon as the record is on disk, in
		// order with the other writes, even if this caller gave up
		// waiting: a forget that follows finds the record, not a lease.
		released = st.leases.Release(key, token)
	})
	if err != nil {
		return false, err
	}
	return released || again, nil
}

// Release implements Store.
func (s *Store) Release(_ context.Context, key, token string) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	return st.leases.Release(key, token), nil
}

// Get implements Store: the lease in memory, else the record on disk.
func (s *Store) Get(_ context.Context, key string) (dedup.Entry, error) {
	st, err := s.st()
	if err != nil {
		return dedup.Entry{}, err
	}
	if e, ok := st.leases.Lookup(key); ok {
		return e, nil
	}
	var e dedup.Entry
	if !st.idx.mayBeDone(key, unixNano(st.now())) {
		return e, nil
	}
	err = st.view(func(tx *bolt.Tx) error {
		e = (&fileTx{events: tx.Bucket(bucketEvents), now: st.now()}).entry(key)
		return nil
	})
	return e, err
}

// Forget implements Store: a done record is deleted from the file (on
// disk when Forget returns); a lease, with force, from memory, and the
// record from the file too.
//
// Both go through the writer, after every write queued before: the
// write of a commit that a stalled disk holds (its caller gave up
// waiting, its lease kept) lands before the forget, never after it. If
// the disk does not take the forget in time, it is an error: nothing
// was forgotten if the writer had not taken it yet (errFileStalled);
// else it may still be applied when the disk answers
// (errFileWritePending, which says so).
func (s *Store) Forget(_ context.Context, key string, force bool) (dedup.Entry, bool, error) {
	st, err := s.st()
	if err != nil {
		return dedup.Entry{}, false, err
	}
	if !force {
		if e, ok := st.leases.Lookup(key); ok {
			return e, false, nil // in flight
		}
	}
	var rec, lease dedup.Entry
	err = st.writeThen(func(tx *fileTx) error {
		if rec = tx.entry(key); rec.Value == "" {
			return nil
		}
		if err := tx.unindex(key); err != nil {
			return err
		}
		tx.ch.forgot = append(tx.ch.forgot, st.idx.hash(key))
		return tx.events.Delete([]byte(key))
	}, func() {
		if force {
			lease, _ = st.leases.Forget(key, true)
		}
	})
	switch {
	case err != nil:
		return dedup.Entry{}, false, err
	case lease.Value != "":
		return lease, true, nil
	}
	return rec, rec.Value != "", nil
}

// Entries returns the number of done records in the file, including
// expired ones that the sweeper has not deleted yet.
func (s *Store) Entries() (int, error) {
	st, err := s.st()
	if err != nil {
		return 0, err
	}
	var n int
	err = st.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketEvents).Stats().KeyN
		return nil
	})
	return n, err
}

// StateID implements dedup.StateSharer: the resolved path of the file.
func (s *Store) StateID() string { return "file " + s.path }

// On disk: bucket "events" maps a key to its expiry (8 bytes, Unix
// nanoseconds, big-endian) followed by the done record as the other
// stores hold it ("done:{...}"); bucket "expiry" indexes the keys by
// expiry (8 bytes then the key) for the sweeper; bucket "leases" holds,
// in the same form, the leases that a clean stop parked.
var (
	bucketEvents = []byte("events")
	bucketExpiry = []byte("expiry")
	bucketLeases = []byte("leases") // leases parked by a clean stop
)

const (
	fileSweepEvery = 10 * time.Second
	// fileSweepBatch bounds the entries one sweep transaction deletes,
	// so that a sweep holds the writer for a few milliseconds at most.
	fileSweepBatch = 500
	// fileMaxBatch bounds the operations grouped in one transaction: one
	// transaction takes every write waiting (at most one per delivery in
	// flight), up to this many.
	fileMaxBatch = 8192
)

var errFileLocked = errors.New("in use by another process")

// fileState is one open database file, shared through the usage pool
// by every config of this process that uses the same path.
//
// Done records are written to the file, each on disk before its commit
// returns. Leases are kept in memory: the file is locked by this
// process, so every delivery that can compete for a key is served here,
// and an in-memory lease is as atomic as a written one, at no disk
// write. A crash loses the leases in flight, which is what their expiry
// would do a little later: the connections of those deliveries died
// with the process, Sangho retries them, and each retry is processed
// once (the backends' work for the cut requests was not acknowledged).
// A clean stop parks the live leases in the file, and the next start
// takes them back, so that a hold (unknown fate) outlives a restart.
type fileState struct {
	path   string
	db     *bolt.DB
	now    func() time.Time
	logger *zap.Logger
	leases *memstate.State
	idx    *doneIndex // the keys of the done records in the file

	ops  chan *fileOp
	stop chan struct{}
	wg   sync.WaitGroup

	txns, writes atomic.Int64 // write transactions, and the writes they carried

	parkMu sync.Mutex // parking leases and closing
	closed bool
}

// openFileState opens (creating it if needed) the database at path.
func openFileState(path string, now func() time.Time, sweepEvery time.Duration, logger *zap.Logger) (*fileState, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("file store: creating the folder of %s: %v", path, err)
	}
	if err := createFileDB(path); err != nil {
		return nil, err
	}
	if err := checkFileSize(path); err != nil {
		return nil, err
	}
	st, err := openBolt(path, now, sweepEvery, logger)
	if err != nil {
		return nil, err
	}
	openFiles.Store(st, struct{}{})
	st.wg.Add(2)
	go st.writer()
	go st.sweeper(sweepEvery)
	return st, nil
}

// openBolt opens the database, checks it and takes back the parked
// leases. bbolt panics on a damaged page it reads: that is an error
// naming the file here, never a crash of Caddy.
func openBolt(path string, now func() time.Time, sweepEvery time.Duration, logger *zap.Logger) (st *fileState, err error) {
	var db *bolt.DB
	defer func() {
		if p := recover(); p != nil {
			if db != nil {
				db.Close()
			}
			if st != nil {
				st.leases.Destruct()
			}
			st, err = nil, fileDamaged(path, p)
		}
	}()
	// First, read-only: every page of the store's buckets is read here,
	// where a damaged one's panic is caught, and the index is built.
	idx, txid, err := preread(path)
	if err != nil {
		return nil, err
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      time.Nanosecond, // try the lock once: never hang
		FreelistType: bolt.FreelistMapType,
		// The freelist is written with every commit (bbolt's default)
		// rather than rebuilt at open by bbolt's check of every page,
		// which runs partly in a goroutine of its own: a damaged page
		// would panic there past the handle bolt.Open has taken (its
		// file descriptor and lock), and bbolt's read-only check of the
		// same pages races with its own rollback on that panic. Tried
		// (NoFreelistSync) and measured: no gain shown at the request
		// level (bench/FILESTORE.md).
		NoFreelistSync: fileNoFreelistSync,
	})
	if err != nil {
		return nil, fileOpenError(path, err)
	}
	if err := checkFileDB(db, path); err != nil {
		db.Close()
		return nil, err
	}
	st = &fileState{path: path, db: db, now: now, logger: logger, leases: memstate.New(now, sweepEvery),
		ops: make(chan *fileOp), stop: make(chan struct{}), idx: idx}
	if err := db.View(func(tx *bolt.Tx) error {
		if tx.ID() != txid { // written between the two opens (by another process): read again
			st.idx = newDoneIndex()
			return loadIndex(tx, st.idx)
		}
		return nil
	}); err != nil {
		st.leases.Destruct()
		db.Close()
		return nil, fmt.Errorf("file store: reading the records of %s: %v", path, err)
	}
	if err := st.unparkLeases(); err != nil {
		st.leases.Destruct()
		db.Close()
		return nil, fmt.Errorf("file store: reading the leases parked in %s: %v", path, err)
	}
	return st, nil
}

// fileDamaged is the error of a damaged page that bbolt panicked on.
func fileDamaged(path string, p any) error {
	return fmt.Errorf("file store: %s is damaged (%v): restore it from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)", path, p)
}

// view runs fn in a read-only transaction; a damaged page is an error.
func (st *fileState) view(fn func(*bolt.Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fileDamaged(st.path, p)
			st.logger.Error("damaged database file", zap.String("path", st.path), zap.Any("panic", p))
		}
	}()
	return st.db.View(fn)
}

// update runs fn in a write transaction; a damaged page is an error
// (bbolt rolls the transaction back), never a crash of the writer.
func (st *fileState) update(fn func(*bolt.Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fileDamaged(st.path, p)
			st.logger.Error("damaged database file", zap.String("path", st.path), zap.Any("panic", p))
		}
	}()
	return st.db.Update(fn)
}

// createFileDB creates a new, empty database at path if there is no
// file there, atomically: it is built under a temporary name and linked
// into place, so that a file at path is always a whole database, and an
// empty or cut file there is damage to report, never a new start.
func createFileDB(path string) error {
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nil // exists, or cannot be checked: bolt.Open says what is wrong
	}
	tmp := path + ".new-" + strconv.Itoa(os.Getpid())
	defer os.Remove(tmp)
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Nanosecond})
	if err != nil {
		return fmt.Errorf("file store: creating %s: %v", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketEvents, bucketExpiry, bucketLeases} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("file store: creating %s: %v", path, err)
	}
	// Link, not rename: if another process created the file meanwhile,
	// keep theirs (the lock then tells who runs).
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("file store: creating %s: %v", path, err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync() // make the new name durable
		dir.Close()
	}
	return nil
}

// fileOpenError explains why bolt.Open failed, naming the file and what
// to do.
func fileOpenError(path string, err error) error {
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return fmt.Errorf("file store: %s is %w (another Caddy with the same data directory or store path?): stop it, or give this Caddy another path with `store file <path>`",
			path, errFileLocked)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch), errors.Is(err, bolterrors.ErrChecksum):
		return fmt.Errorf("file store: %s is not a valid sangho_dedup database or is damaged (%v): restore it from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)",
			path, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("file store: cannot open %s: %v: it must be readable and writable by the user Caddy runs as", path, err)
	}
	return fmt.Errorf("file store: cannot open %s: %v", path, err)
}

// checkFileSize refuses a file cut short, before bbolt maps it: bbolt
// would read pages past its end (a fatal SIGBUS). It reads the two meta
// pages the way bbolt does (magic, version, FNV-1a checksum; the valid
// one with the highest transaction ID wins) and compares the size its
// data needs with the file's. Anything else that is wrong with the
// header is left to bolt.Open, which says so.
func checkFileSize(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // bolt.Open reports it
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	if fi.Size() == 0 { // bbolt would make it a new, empty database
		return fmt.Errorf("file store: %s is empty, not a database (this store never leaves an empty file: it was cut or replaced): restore it from a backup, or delete it to start with an empty store (deliveries of already processed events would then be processed again)", path)
	}
	var need, txid uint64
	found := false
	for _, off := range []int64{0, 4096, int64(os.Getpagesize())} {
		var b [16 + 64]byte // page header, then the meta
		if _, err := f.ReadAt(b[:], off); err != nil {
			continue
		}
		m := b[16:]
		le := binary.LittleEndian
		h := fnv.New64a()
		h.Write(m[:56])
		if le.Uint32(m[0:]) != 0xED0CDAED || le.Uint32(m[4:]) != 2 || le.Uint64(m[56:]) != h.Sum64() {
			continue
		}
		pageSize, pgid, tx := uint64(le.Uint32(m[8:])), le.Uint64(m[40:]), le.Uint64(m[48:])
		if off != 0 && off != int64(pageSize) {
			continue
		}
		if !found || tx > txid {
			found, txid, need = true, tx, pgid*pageSize
		}
	}
	if found && uint64(fi.Size()) < need {
		return fmt.Errorf("file store: %s is truncated (%d bytes, its data needs %d): restore it from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)",
			path, fi.Size(), need)
	}
	return nil
}

// checkFileDB refuses a database that lacks the store's buckets.
func checkFileDB(db *bolt.DB, path string) error {
	return db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketEvents) == nil || tx.Bucket(bucketExpiry) == nil || tx.Bucket(bucketLeases) == nil {
			return fmt.Errorf("file store: %s is a bbolt database but not a sangho_dedup one: give the store another path", path)
		}
		return nil
	})
}

// fileNoFreelistSync: see openBolt (a variable for the benchmarks that
// compare both).
var fileNoFreelistSync = false

// preread opens the file read-only, checks that it is a store's, reads
// every page of its buckets (a damaged one panics here, in openBolt's
// recover: the file is refused at open) and returns the index of its
// done records and the ID of the transaction read.
func preread(path string) (idx *doneIndex, txid int, err error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Nanosecond})
	if err != nil {
		return nil, 0, fileOpenError(path, err)
	}
	defer db.Close() // also when a damaged page panics
	if err := checkFileDB(db, path); err != nil {
		return nil, 0, err
	}
	idx = newDoneIndex()
	err = db.View(func(tx *bolt.Tx) error {
		txid = tx.ID()
		if err := loadIndex(tx, idx); err != nil {
			return err
		}
		for _, b := range [][]byte{bucketExpiry, bucketLeases} {
			c := tx.Bucket(b).Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("file store: reading the records of %s: %v", path, err)
	}
	return idx, txid, nil
}

// loadIndex reads the key and expiry of every done record in the file
// into idx (the expired ones too: the sweep deletes them from both).
func loadIndex(tx *bolt.Tx, idx *doneIndex) error {
	c := tx.Bucket(bucketEvents).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(v) >= 8 {
			idx.add(maphash.Bytes(idx.seed, k), binary.BigEndian.Uint64(v))
		}
	}
	return nil
}

// lookup returns the live done record of key: none if the index has no
// live record for it, else what the file holds.
func (st *fileState) lookup(key string) (string, bool, error) {
	if !st.idx.mayBeDone(key, unixNano(st.now())) {
		return "", false, nil
	}
	return st.read(key)
}

// read returns the live done record of key from a read-only transaction.
func (st *fileState) read(key string) (string, bool, error) {
	var val string
	var ok bool
	err := st.view(func(tx *bolt.Tx) error {
		val, ok = (&fileTx{events: tx.Bucket(bucketEvents), now: st.now()}).get(key)
		return nil
	})
	return val, ok, err
}

// parkLeases writes the live leases to the file (at a clean stop).
func (st *fileState) parkLeases() error {
	return st.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		return st.leases.Range(func(key, val string, expires time.Time) error {
			return b.Put([]byte(key), fileRecord(unixNano(expires), val))
		})
	})
}

// unparkLeases takes back the leases a clean stop parked, those that
// have not expired since, and empties the bucket.
func (st *fileState) unparkLeases() error {
	return st.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		if b.Stats().KeyN == 0 {
			return nil
		}
		now := st.now()
		err := b.ForEach(func(k, v []byte) error {
			if len(v) >= 8 {
				if exp := unixTime(binary.BigEndian.Uint64(v)); now.Before(exp) {
					st.leases.Put(string(k), string(v[8:]), exp)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(bucketLeases); err != nil {
			return err
		}
		_, err = tx.CreateBucket(bucketLeases)
		return err
	})
}

// fileOp is one write waiting for the writer.
type fileOp struct {
	fn    func(*fileTx) error
	after func() // run by the writer once fn's transaction is on disk, if fn succeeded
	err   error
	done  chan struct{}
}

var fileOpPool = sync.Pool{New: func() any { return &fileOp{done: make(chan struct{}, 1)} }}

var errFileClosed = errors.New("file store: the database file is closed (Caddy is stopping)")

// isClosed reports whether Destruct has begun.
func (st *fileState) isClosed() bool {
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

// write runs fn in a write transaction and returns once the transaction
// is on disk. Concurrent writes share one transaction.
func (st *fileState) write(fn func(*fileTx) error) error {
	return st.writeThen(fn, nil)
}

// writeThen is write, and then after, run by the writer once fn's
// transaction is on disk (if fn succeeded), in the order of the writes:
// whether or not the caller is still waiting (a stalled disk), and
// before any later write. A change to the leases in memory that must
// follow a write (a commit's release, a forget's) goes there.
func (st *fileState) writeThen(fn func(*fileTx) error, after func()) error {
	op := fileOpPool.Get().(*fileOp)
	op.fn, op.after, op.err = fn, after, nil
	timer := time.NewTimer(fileWriteTimeout)
	defer timer.Stop()
	select {
	case st.ops <- op:
	case <-st.stop:
		op.fn, op.after = nil, nil
		fileOpPool.Put(op)
		return errFileClosed
	case <-timer.C:
		op.fn, op.after = nil, nil
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
	op.fn, op.after, op.err = nil, nil, nil
	fileOpPool.Put(op)
	return err
}

// writer runs the writes: each transaction takes every write that is
// waiting (group commit), so a burst costs one fsync, and a write that
// is alone goes at once.
func (st *fileState) writer() {
	defer st.wg.Done()
	batch := make([]*fileOp, 0, 64)
	var changes indexChanges
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
		st.txns.Add(1)
		st.writes.Add(int64(len(batch)))
		changes.reset()
		err := st.update(func(btx *bolt.Tx) error {
			tx := fileTx{events: btx.Bucket(bucketEvents), expiry: btx.Bucket(bucketExpiry), now: st.now(), ix: st.idx, ch: &changes}
			// Expiry keys grow with time: filled pages are not split in
			// half (the default, for inserts all over the tree).
			tx.expiry.FillPercent = 0.9
			for _, op := range batch {
				op.err = op.fn(&tx)
			}
			return nil
		})
		if err == nil {
			st.idx.apply(&changes) // before the leases are dropped
		}
		for _, op := range batch {
			if err != nil {
				op.err = fmt.Errorf("file store: writing %s: %v", st.path, err)
			} else if op.err == nil && op.after != nil {
				op.after()
			}
			op.done <- struct{}{}
		}
	}
}

// sweeper deletes expired entries every `every`, in bounded batches.
func (st *fileState) sweeper(every time.Duration) {
	defer st.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			return
		case <-t.C:
			if _, err := st.sweep(); err != nil && !errors.Is(err, errFileClosed) {
				st.logger.Error("sweep failed", zap.String("path", st.path), zap.Error(err))
			}
		}
	}
}

// sweep deletes every expired entry, fileSweepBatch per transaction, and
// returns how many it deleted.
func (st *fileState) sweep() (int, error) {
	total := 0
	for {
		n := 0
		err := st.write(func(tx *fileTx) error {
			var err error
			n, err = tx.sweep(fileSweepBatch)
			return err
		})
		total += n
		if err != nil || n < fileSweepBatch {
			return total, err
		}
	}
}

// Destruct stops the writer and the sweepers, parks the live leases in
// the file and closes it; the usage pool calls it when the last config
// using the file is cleaned up.
func (st *fileState) Destruct() error {
	close(st.stop)
	st.wg.Wait()
	st.leases.Destruct()
	openFiles.Delete(st)
	st.parkMu.Lock()
	defer st.parkMu.Unlock()
	err := st.parkLeases()
	if cerr := st.db.Close(); err == nil {
		err = cerr
	}
	st.closed = true
	return err
}

// openFiles are the files open in this process, for the exit hook.
var openFiles sync.Map // *fileState -> struct{}

// parkOpenFiles parks the live leases of every file still open at
// process exit: one still in use then (a commit retry pending, an old
// config draining after a reload, requests cut off by the grace period)
// is never destructed before the process ends, and its holds would be
// lost.
func parkOpenFiles() {
	openFiles.Range(func(k, _ any) bool {
		st := k.(*fileState)
		st.parkMu.Lock()
		defer st.parkMu.Unlock()
		if !st.closed {
			if err := st.parkLeases(); err != nil {
				st.logger.Error("parking leases at exit", zap.String("path", st.path), zap.Error(err))
			}
		}
		return true
	})
}

// fileTx is the store's view of one bbolt transaction.
type fileTx struct {
	events, expiry *bolt.Bucket
	now            time.Time
	ix             *doneIndex    // nil in read-only transactions
	ch             *indexChanges // what the transaction changes in ix
}

// entry returns key's live record and its expiry.
func (tx *fileTx) entry(key string) dedup.Entry {
	raw := tx.events.Get([]byte(key))
	if len(raw) < 8 {
		return dedup.Entry{}
	}
	exp := unixTime(binary.BigEndian.Uint64(raw))
	if !tx.now.Before(exp) {
		return dedup.Entry{}
	}
	return dedup.Entry{Value: string(raw[8:]), ExpiresAt: exp}
}

// get returns the live value of key.
func (tx *fileTx) get(key string) (string, bool) {
	raw := tx.events.Get([]byte(key))
	if len(raw) < 8 {
		return "", false
	}
	if unixNano(tx.now) >= binary.BigEndian.Uint64(raw) {
		return "", false
	}
	return string(raw[8:]), true
}

// put sets key to val for ttl, keeping the expiry bucket and the index
// in step.
func (tx *fileTx) put(key, val string, ttl time.Duration) error {
	_, err := tx.replace(key, val, ttl)
	return err
}

// replace is put, and reports whether key held val, live, before.
func (tx *fileTx) replace(key, val string, ttl time.Duration) (same bool, err error) {
	exp := unixNano(tx.now.Add(ttl))
	// One allocation for the three byte strings the transaction keeps
	// until it commits (bbolt keeps what Put is given): the key, the
	// record, the expiry key.
	buf := make([]byte, 2*len(key)+16+len(val))
	k, rec, ek := buf[:len(key)], buf[len(key):len(key)+8+len(val)], buf[len(key)+8+len(val):]
	copy(k, key)
	if raw := tx.events.Get(k); len(raw) >= 8 {
		old := binary.BigEndian.Uint64(raw)
		same = unixNano(tx.now) < old && string(raw[8:]) == val
		binary.BigEndian.PutUint64(ek, old)
		copy(ek[8:], key)
		if err := tx.expiry.Delete(ek); err != nil {
			return false, err
		}
	}
	binary.BigEndian.PutUint64(rec, exp)
	copy(rec[8:], val)
	if err := tx.events.Put(k, rec); err != nil {
		return false, err
	}
	tx.ch.added = append(tx.ch.added, hashExp{tx.ix.hash(key), exp})
	binary.BigEndian.PutUint64(ek, exp)
	copy(ek[8:], key)
	return same, tx.expiry.Put(ek, nil)
}

// unixNano is t in Unix nanoseconds as the file keeps expiries,
// saturated: a time past the last that int64 nanoseconds can hold (in
// the year 2262) is that last one, never wrapped into the past, so a
// long ttl cannot turn into an expired record.
func unixNano(t time.Time) uint64 {
	switch {
	case t.After(lastUnixNano):
		return math.MaxInt64
	case t.Before(time.Unix(0, 0)):
		return 0
	}
	return uint64(t.UnixNano())
}

var lastUnixNano = time.Unix(0, math.MaxInt64)

// unixTime is the time of an expiry read from the file. Past the year
// 2262 it is the last time unixNano writes. (Versions before the
// saturation wrote such expiries as their int64 bits; read unsigned,
// those are in the future too, as they were meant to be.)
func unixTime(exp uint64) time.Time {
	if exp > math.MaxInt64 {
		return lastUnixNano
	}
	return time.Unix(0, int64(exp))
}

// fileRecord is a value on disk: the expiry, then the value.
func fileRecord(exp uint64, val string) []byte {
	rec := make([]byte, 8+len(val))
	binary.BigEndian.PutUint64(rec, exp)
	copy(rec[8:], val)
	return rec
}

// unindex removes key's entry from the expiry index, if it has one.
func (tx *fileTx) unindex(key string) error {
	if raw := tx.events.Get([]byte(key)); len(raw) >= 8 {
		return tx.expiry.Delete(expiryKey(binary.BigEndian.Uint64(raw), key))
	}
	return nil
}

func expiryKey(exp uint64, key string) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, exp)
	copy(k[8:], key)
	return k
}

// sweep deletes up to max expired entries, oldest first.
func (tx *fileTx) sweep(max int) (int, error) {
	now := unixNano(tx.now)
	var keys [][]byte
	c := tx.expiry.Cursor()
	for k, _ := c.First(); k != nil && len(keys) < max; k, _ = c.Next() {
		if len(k) < 8 || binary.BigEndian.Uint64(k) > now {
			break
		}
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := tx.expiry.Delete(k); err != nil {
			return 0, err
		}
		key := k[8:]
		if raw := tx.events.Get(key); len(raw) >= 8 && binary.BigEndian.Uint64(raw) <= now {
			if err := tx.events.Delete(key); err != nil {
				return 0, err
			}
			tx.ch.swept = append(tx.ch.swept, maphash.Bytes(tx.ix.seed, key))
		}
	}
	tx.ch.sweepAt = now
	return len(keys), nil
}

// Interface guards
var (
	_ dedup.Store           = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
	_ caddy.Destructor      = (*fileState)(nil)
	_ dedup.Drainer         = (*Store)(nil)
	_ dedup.ExitParker      = (*Store)(nil)
	_ dedup.StateSharer     = (*Store)(nil)
)
