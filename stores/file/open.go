package file

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/memtable"
)

const (
	fileSweepEvery = 10 * time.Second
	// fileSweepBatch bounds the entries one sweep batch deletes, so that
	// a sweep holds the writer for a few milliseconds at most.
	fileSweepBatch = 500
	// fileMaxBatch bounds the operations grouped in one batch: one batch
	// takes every write waiting (at most one per delivery in flight), up
	// to this many.
	fileMaxBatch = 8192
	// fileL0Tables is Pebble's L0CompactionThreshold (see
	// pebbleOptions): L0 is compacted at about half as many sublevels.
	fileL0Tables = 8
	// fileMemTableSize is the size of one memtable (Pebble keeps up to
	// two while one is flushed): some 60,000 new events.
	fileMemTableSize = 16 << 20
)

// fileCacheSize is the blocks Pebble's block cache holds: the index and
// filter blocks (at 26 M records 26 MiB of index and 36 MiB of filter
// blocks, most of them the last level's, which a new event's lookup
// asks: see lookup), and the data blocks of recent duplicates. The
// store's memory is this, the memtables and the leases, whatever the
// number of records. (A variable: the bench tool tries others.)
var fileCacheSize int64 = 64 << 20

// fileMemTableReserve is what Pebble takes out of its cache's size for
// the memtables: the one written and one it keeps for reuse (a third
// while one is flushed). The cache is given it on top of fileCacheSize,
// so that its blocks have fileCacheSize. (Before, a 32 MiB cache held 16
// MiB of blocks.)
const fileMemTableReserve = 2 * fileMemTableSize

var errFileLocked = errors.New("in use by another process")

// shared is one open store, shared through the usage pool by every
// config of this process that uses the same path.
//
// Done records are written to the database, each on disk before its
// commit returns. Leases (and marks, leases whose time ran out, kept
// dedup.MarkFor) are kept in memory, where claims race atomically (the
// store is locked by this process, so every delivery that can compete
// for a key is served here), and written through to the database ('l'
// keys, see leaseJournal, in the writer's batches): a claim's and a
// renewal's write is synced before they return, so a lease outlives a
// kill -9 of Caddy and a power cut; a commit deletes its lease in the
// batch of its record; a release's and a sweep's deletion is queued for
// the next batch, not waited for (lost in a crash, the lease comes back
// and ends at its time: a redelivery waits, then is marked; never
// processed unmarked beside an attempt). The next start takes the
// leases back from the database.
type shared struct {
	path   string // the store's path, as errors name it
	dir    string // its folder (StoreDir)
	db     *pebble.DB
	now    func() time.Time
	logger *zap.Logger
	leases *memtable.Table

	ops      chan *fileOp
	stop     chan struct{} // closed by stopWorkers
	stopOnce sync.Once
	wg       sync.WaitGroup

	sw sweepState // where the sweeper is in its pass over the records

	txns, writes  atomic.Int64 // write batches, and the writes they carried
	reads         atomic.Int64 // point reads (of a done record: claims, commits, gets)
	filteredReads atomic.Int64 // those that asked every level's filters (see lookup)
	recent        *recentKeys  // the done keys committed lately (see lookup)

	parkMu sync.Mutex // the exit hook's sync and closing
	closed bool

	// broken is the error that failed the store for good (see
	// commitBatch), nil while it works.
	broken atomic.Pointer[error]

	releaseFolder func() // unregisters the folder (claimFolder), once the database is closed

	lq leaseQueue // the leases' changes on their way to the writer
	// closeMu orders the writes of the lease queue once the writer has
	// stopped (syncLeases) with Destruct's last one and the close.
	closeMu sync.Mutex

	beforeCommitHook atomic.Pointer[beforeCommitHook] // tests only
	leasesTakenHook  atomic.Pointer[func([]*fileOp)]  // tests only: runs once the writer took the lease queue
}

// statFolder stats a store's folder (see openFolders); a test replaces
// it to see two folders as one.
var statFolder = os.Stat

// openFolders are the folders of the stores open in this process, by
// what the file system says they are (os.SameFile: device and inode),
// not by path: a bind mount, or a case-insensitive file system, gives a
// folder two paths that no symlink joins (resolvePath), and Pebble's
// lock, the process's own (fcntl), lets the process open it twice.
var openFolders struct {
	sync.Mutex
	m map[string]*openFolder // by folder path
}

// openFolder is a folder of openFolders: its stat, and how many opens
// of it by that path are under way or open (a second one by the same
// path is Pebble's to refuse; one given up on holds it until it ends).
type openFolder struct {
	fi   os.FileInfo
	refs int
}

// claimFolder registers dir as open in this process, and returns the
// func that unregisters it (once); an error if the folder is open here
// already by another path.
func claimFolder(path, dir string) (func(), error) {
	fi, err := statFolder(dir)
	if err != nil {
		return nil, fmt.Errorf("file store: %s: %v", path, err)
	}
	openFolders.Lock()
	defer openFolders.Unlock()
	for other, f := range openFolders.m {
		if other != dir && os.SameFile(fi, f.fi) {
			return nil, fmt.Errorf("file store: %s: its folder %s is the folder %s, open in this Caddy by that path (a bind mount, or a file system that ignores case): give every config the same path",
				path, dir, other)
		}
	}
	if openFolders.m == nil {
		openFolders.m = map[string]*openFolder{}
	}
	f := openFolders.m[dir]
	if f == nil {
		f = &openFolder{fi: fi}
		openFolders.m[dir] = f
	}
	f.refs++
	var once sync.Once
	return func() {
		once.Do(func() {
			openFolders.Lock()
			defer openFolders.Unlock()
			if f.refs--; f.refs == 0 {
				delete(openFolders.m, dir)
			}
		})
	}, nil
}

// testFS, when set (by a test), is the file system of the stores opened
// then (nil: Pebble's default, the disk).
var testFS vfs.FS

// pebbleOptions are the store's Pebble options. ErrorIfNotExists: a
// store folder without its database (emptied, its marker lost) is damage
// to report, never a new, empty store; stores are created by
// createStore only.
func pebbleOptions(path string, logger *zap.Logger, readOnly bool) *pebble.Options {
	o := &pebble.Options{
		FS:               testFS,
		Logger:           pebbleLogger{path: path, l: logger},
		ReadOnly:         readOnly,
		ErrorIfNotExists: true,
		CacheSize:        fileCacheSize + fileMemTableReserve,
		MemTableSize:     fileMemTableSize,
		// Event IDs are spread over the whole key space, so every
		// compaction of L0 rewrites all of the level below it (Lbase,
		// 35-50 MiB at 26 M records). Pebble scores L0 as twice its
		// sublevels over this threshold: with 8, L0 is compacted at
		// about 4 sublevels of 16 MiB memtables (some 64 MiB of them, as
		// the 8 sublevels of 8 MiB ones of the threshold 16 before), not
		// 2 of 4 MiB as with Pebble's defaults, so each rewrite of Lbase
		// carries eight times the new records; and a new ID's lookup asks
		// 4 L0 filters (in the cache), not 8 (docs/stores.md,
		// "Compactions", "16 MiB memtables"). Behind a compaction backlog
		// up to 23 sublevels (384 MiB of memtables, as before) before
		// writes stop, at 24.
		L0CompactionThreshold: fileL0Tables,
		L0StopWritesThreshold: 3 * fileL0Tables,
		FormatMajorVersion:    pebble.FormatNewest,
		EventListener: &pebble.EventListener{
			// Above all a flush or a compaction that failed (a full disk),
			// which Pebble retries, some 75 times a second: said at most
			// once every 10 s, with the count of those not said.
			BackgroundError: backgroundErrorLog(path, logger),
			// Pebble's default ends the process. The store answers the
			// reads of a damaged table with an error naming the store
			// instead (readErr), and says so here.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				logger.Error("damaged store", zap.String("path", path), zap.String("folder", StoreDir(path)),
					zap.String("file", info.Path), zap.Error(info.Details),
					zap.String("fix", "restore the folder from a backup, or move it away to start with an empty store"))
			},
			// Above all a SingleDelete that met two writes of a lease,
			// or none (deleteLease): the store's bug, which could bring
			// a lease back. Said, so that it is seen.
			PossibleAPIMisuse: func(info pebble.PossibleAPIMisuseInfo) {
				logger.Error("file store: Pebble reports a misuse of its API by the store (a bug: please report it)",
					zap.String("path", path), zap.String("kind", info.Kind.String()), zap.ByteString("key", info.UserKey))
			},
		},
	}
	for i := range o.Levels {
		// A claim of a new event asks each level's filter, not its data
		// blocks, 10 bits per key, about 1 % false positives; the last
		// level's too (see lookup).
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	// Fast compression where data is rewritten often, zstd where it
	// settles (the last levels: most of the records).
	o.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionBalanced })
	return o
}

// backgroundErrorEvery is the least time between two lines of
// backgroundErrorLog.
var backgroundErrorEvery = 10 * time.Second

// backgroundErrorLog logs Pebble's background errors for the store at
// path, at most one every backgroundErrorEvery.
func backgroundErrorLog(path string, logger *zap.Logger) func(error) {
	var mu sync.Mutex
	var last time.Time
	var unsaid int
	return func(err error) {
		mu.Lock()
		if time.Since(last) < backgroundErrorEvery {
			unsaid++
			mu.Unlock()
			return
		}
		n := unsaid
		last, unsaid = time.Now(), 0
		mu.Unlock()
		logger.Error("file store background error", zap.String("path", path), zap.Error(err), zap.Int("not_logged_since", n))
	}
}

// pebbleLogger sends Pebble's messages to Caddy's log.
type pebbleLogger struct {
	path string
	l    *zap.Logger
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), zap.String("path", p.path))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), zap.String("path", p.path))
}

// Fatalf is called by Pebble on an error it cannot go on from, and
// must not return: it panics with a pebbleFatal. In the writer's commit
// (a write of the log refused: a full disk, an I/O error) the writer
// recovers it and fails the store (commitBatch); anywhere else the
// panic ends the process, as Pebble requires.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, zap.String("path", p.path))
	panic(pebbleFatal("file store " + p.path + ": " + msg))
}

// pebbleFatal is the panic of pebbleLogger.Fatalf.
type pebbleFatal string

func (f pebbleFatal) Error() string { return string(f) }

// asFatal returns p, a recovered panic, as the pebbleFatal it is; any
// other panic goes on.
func asFatal(p any) error {
	f, ok := p.(pebbleFatal)
	if !ok {
		panic(p)
	}
	return f
}

// fail fails the store for good with cause, logged once, and returns
// the error every later claim, renewal, commit and forget gets: they
// are refused at once, without the database (whose commits cannot go
// on after a fatal error). Reads go on. Caddy must be restarted.
func (st *shared) fail(cause error) error {
	err := fmt.Errorf("%w (the store has failed: claims and commits are refused until Caddy restarts)", cause)
	if st.broken.CompareAndSwap(nil, &err) {
		st.logger.Error("file store failed", zap.String("path", st.path), zap.String("folder", st.dir), zap.Error(cause),
			zap.String("fix", "free space on the disk or repair it, then restart Caddy; until then claims are refused (503, or passed on under on_store_error pass)"))
		st.lq.fail(err)
	}
	return *st.broken.Load()
}

// failure is the error that failed the store, nil while it works.
func (st *shared) failure() error {
	if p := st.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// openShared opens the store at path, creating it (or taking over an
// earlier release's file at path) if its folder does not exist.
func openShared(path string, now func() time.Time, sweepEvery time.Duration, logger *zap.Logger) (*shared, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("file store: creating the folder of %s: %v", path, err)
	}
	limitMallocArenas()
	dir := StoreDir(path)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := createStore(path, dir, logger); err != nil {
			return nil, err
		}
	} else if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		logger.Info("old store file unused", zap.String("old_file", path), zap.String("folder", dir),
			zap.String("note", "an earlier release's file, taken over before; the way back to that release: docs/stores.md"))
	}
	release, err := claimFolder(path, dir)
	if err != nil {
		return nil, err
	}
	db, err := openPebble(dir, pebbleOptions(path, logger, false), release)
	if err != nil {
		if !errors.Is(err, errOpenGivenUp) {
			release() // else once the open given up on ends (openPebble)
		}
		return nil, storeOpenError(path, dir, err)
	}
	if err := checkFormat(db, path, dir); err != nil {
		db.Close()
		release()
		return nil, err
	}
	st := &shared{path: path, dir: dir, db: db, now: now, logger: logger, releaseFolder: release,
		ops: make(chan *fileOp), stop: make(chan struct{}), recent: newRecentKeys()}
	var journal memtable.Journal
	if leaseWrites != leaseInMemory {
		journal = leaseJournal{st}
	}
	st.leases = memtable.NewJournaled(now, sweepEvery, journal)
	if err := st.loadLeases(); err != nil {
		st.leases.Destruct()
		db.Close()
		release()
		return nil, err
	}
	openFiles.Store(st, struct{}{})
	st.wg.Add(2)
	go st.writer()
	go st.sweeper(sweepEvery)
	return st, nil
}

// errOpenGivenUp is the error of an open given up on (openPebble).
var errOpenGivenUp = errors.New("the open did not finish")

// openGrace is how long an open that met a background error (a flush of
// the log's records refused: a full disk) is given to finish.
var openGrace = 5 * time.Second

// openPebble opens the database in dir. Pebble's Open waits for the
// flush of the records its log holds, which it retries for ever when
// the disk refuses it (a restart after the disk filled): Caddy would
// never start, nor say why. An open that meets a background error and
// has not finished openGrace later is that error, errOpenGivenUp. (Its
// goroutine stays, holding the folder and its lock until the process
// ends, or until it opens the database, which it then closes, and calls
// released: `caddy run` exits on the error, and a running Caddy can open
// the store again once that open has ended.) A fatal error of Pebble's
// during the open is an error too.
func openPebble(dir string, o *pebble.Options, released func()) (*pebble.DB, error) {
	bg := make(chan error, 1)
	logBG := o.EventListener.BackgroundError
	o.EventListener.BackgroundError = func(err error) {
		logBG(err)
		select {
		case bg <- err:
		default:
		}
	}
	type opened struct {
		db  *pebble.DB
		err error
	}
	res := make(chan opened) // unbuffered: an open given up on never leaves its database in it
	abandoned := make(chan struct{})
	go func() {
		var r opened
		defer func() {
			if p := recover(); p != nil {
				r = opened{err: asFatal(p)}
			}
			select {
			case res <- r:
			case <-abandoned:
				if r.db != nil {
					_ = r.db.Close()
				}
				released()
			}
		}()
		r.db, r.err = pebble.Open(dir, o)
	}()
	select {
	case r := <-res:
		return r.db, r.err
	case err := <-bg:
		timer := time.NewTimer(openGrace)
		defer timer.Stop()
		select {
		case r := <-res:
			return r.db, r.err
		case <-timer.C:
			close(abandoned)
			return nil, fmt.Errorf("%w %v after an error writing the folder: %w", errOpenGivenUp, openGrace, err)
		}
	}
}

// createStore creates the store's folder, atomically: the database is
// built under a temporary name, with the records of an earlier
// release's file at path if there is one, its format marker written
// last and synced, then renamed into place. A folder at dir is always a
// whole store, and anything less there is damage to report.
func createStore(path, dir string, logger *zap.Logger) error {
	legacy := false
	if fi, err := os.Lstat(path); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("file store: %s is a %s, not a store file of an earlier release (the store's data goes in the folder %s): give the store another path with `store file <path>`",
				path, fileKind(fi), dir)
		}
		legacy = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("file store: cannot check %s: %v", path, err)
	}
	removeCrashedCreations(dir, logger)
	tmp := dir + ".new-" + strconv.Itoa(os.Getpid())
	_ = os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("file store: creating %s: %v", dir, err)
	}
	opts := pebbleOptions(path, logger, false)
	opts.ErrorIfNotExists = false
	db, err := pebble.Open(tmp, opts)
	if err != nil {
		return fmt.Errorf("file store: creating %s: %v", dir, err)
	}
	var done, leases int
	if legacy {
		logger.Info("taking over old store file", zap.String("old_file", path), zap.String("folder", dir))
		if done, leases, err = importLegacy(path, db); err != nil {
			db.Close()
			return err
		}
	}
	err = db.Set(keyFormat, storeFormat, pebble.Sync) // syncs the log, and every write before it
	if err == nil {
		err = db.Flush()
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("file store: creating %s: %v", dir, err)
	}
	// If another process created the store meanwhile, keep theirs (its
	// lock then tells who runs).
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("file store: creating %s: %v", dir, err)
	}
	if d, err := os.Open(filepath.Dir(dir)); err == nil {
		_ = d.Sync() // make the new name durable
		d.Close()
	}
	if legacy {
		logger.Warn("old store file taken over", zap.String("old_file", path), zap.String("folder", dir),
			zap.Int("done_records", done), zap.Int("parked_leases", leases),
			zap.String("note", "every done record and parked lease is in the new store; the old file is left in place, unused: delete it once the way back is no longer needed (docs/stores.md)"))
	}
	return nil
}

// removeCrashedCreations removes the folders dir.new-<pid> that a
// creation (or takeover, a full copy of the old file) left when its
// process died: only folders of exactly that name, whose process is gone
// (one still running may be creating the store now).
func removeCrashedCreations(dir string, logger *zap.Logger) {
	entries, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		return
	}
	prefix := filepath.Base(dir) + ".new-"
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.IsDir() {
			continue
		}
		pid, err := strconv.Atoi(rest)
		if err != nil || pid <= 0 || strconv.Itoa(pid) != rest {
			continue
		}
		if !processGone(pid) {
			continue // running (or not ours to ask): maybe creating the store now
		}
		leftover := filepath.Join(filepath.Dir(dir), e.Name())
		if err := os.RemoveAll(leftover); err != nil {
			logger.Warn("cannot remove a crashed store creation's folder", zap.String("folder", leftover), zap.Error(err))
			continue
		}
		logger.Info("removed a crashed store creation's folder", zap.String("folder", leftover))
	}
}

// processGone reports whether no process pid runs (false if unsure).
func processGone(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return true // Windows: no such process
	}
	defer p.Release()
	return errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}

func fileKind(fi fs.FileInfo) string {
	if fi.IsDir() {
		return "folder"
	}
	return "special file (" + fi.Mode().Type().String() + ")"
}

// checkFormat refuses a Pebble database that is not a sangho_dedup store.
func checkFormat(db *pebble.DB, path, dir string) error {
	v, closer, err := db.Get(keyFormat)
	if errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("file store: %s: the folder %s is a Pebble database but not a sangho_dedup store: give the store another path", path, dir)
	}
	if err != nil {
		return storeOpenError(path, dir, err)
	}
	defer closer.Close()
	if !bytes.Equal(v, storeFormat) {
		return fmt.Errorf("file store: %s: the folder %s is a sangho_dedup store of an unknown format %q (written by a newer version?): run that version, or give this one another path", path, dir, v)
	}
	return nil
}

// storeOpenError explains why the store did not open, naming it and
// what to do.
func storeOpenError(path, dir string, err error) error {
	const reset = "restore the folder from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)"
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return fmt.Errorf("file store: %s (folder %s) is %w (another Caddy with the same data directory or store path?): stop it, or give this Caddy another path with `store file <path>`",
			path, dir, errFileLocked)
	case strings.Contains(err.Error(), "lock held by current process"): // Pebble's, not exported
		return fmt.Errorf("file store: %s (folder %s) is already open in this Caddy: by another path to the same folder (give every config the same path), or by an open that failed (restart Caddy)",
			path, dir)
	case errors.Is(err, pebble.ErrDBDoesNotExist):
		return fmt.Errorf("file store: %s: the folder %s is not a whole store (its database is missing: damaged or emptied): %s", path, dir, reset)
	case pebble.IsCorruptionError(err):
		return fmt.Errorf("file store: %s: the folder %s is damaged (%v): %s", path, dir, err, reset)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("file store: cannot open %s (folder %s): %v: the folder and its files must be readable and writable by the user Caddy runs as", path, dir, err)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("file store: cannot open %s (folder %s): %v: free space on its disk, then start Caddy again (the store is whole)", path, dir, err)
	}
	return fmt.Errorf("file store: cannot open %s (folder %s; if it is damaged, %s): %v", path, dir, reset, err)
}

// fileDamaged is the error of a read that failed or panicked. A read
// that a close overtook (Pebble panics with ErrClosed) is errFileClosed:
// the store is whole.
func fileDamaged(path string, p any) error {
	if err, ok := p.(error); ok && errors.Is(err, pebble.ErrClosed) {
		return errFileClosed
	}
	return fmt.Errorf("file store: %s is damaged (%v): restore it from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)", path, p)
}

// readErr names the store in a read's error.
func (st *shared) readErr(err error) error {
	if errors.Is(err, pebble.ErrClosed) {
		return errFileClosed
	}
	if pebble.IsCorruptionError(err) {
		st.logger.Error("damaged store", zap.String("path", st.path), zap.Error(err))
		return fileDamaged(st.path+" (folder "+st.dir+")", err)
	}
	return fmt.Errorf("file store: reading %s: %v", st.path, err)
}

// get returns the raw value of k, a copy.
func (st *shared) get(k []byte) (v []byte, ok bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			if err = fileDamaged(st.path, p); err != errFileClosed {
				st.logger.Error("damaged store", zap.String("path", st.path), zap.Any("panic", p))
			}
		}
	}()
	if st.isClosed() {
		return nil, false, errFileClosed
	}
	st.reads.Add(1)
	if k[0] == prefixDone {
		return st.lookup(k)
	}
	return st.lookupGet(k)
}

// read returns the live done record of key as a claim answers with it
// (decodeAnswer: no JSON built for a duplicate).
func (st *shared) read(key string) (string, bool, error) {
	e, err := st.entryAs(key, decodeAnswer)
	return e.Value, e.Value != "", err
}

// entry returns key's live done record and its expiry.
func (st *shared) entry(key string) (dedup.Entry, error) {
	return st.entryAs(key, decodeRecord)
}

func (st *shared) entryAs(key string, decode func([]byte) (uint64, string, error)) (dedup.Entry, error) {
	raw, ok, err := st.get(doneKey(key))
	if err != nil || !ok {
		return dedup.Entry{}, err
	}
	exp, val, err := decode(raw)
	if err != nil {
		return dedup.Entry{}, fmt.Errorf("file store: reading %s: key %q: %v", st.path, key, err)
	}
	if unixNano(st.now()) >= exp {
		return dedup.Entry{}, nil
	}
	return dedup.Entry{Value: val, ExpiresAt: unixTime(exp)}, nil
}

// count is the number of keys with prefix p.
func (st *shared) count(p byte) (int, error) {
	it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
	if err != nil {
		return 0, st.readErr(err)
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		return 0, st.readErr(err)
	}
	return n, nil
}

// loadLeases takes back the leases in the database (and the marks,
// leases whose time ran out less than dedup.MarkFor ago), as the
// previous run left them, by a clean stop or a crash; an earlier release
// parked its live leases there at a clean stop, in the same format. It
// deletes those past MarkFor, and those whose event has a live done
// record (a lease whose commit landed before the process ended: taken
// back, the event would read as in flight). A lease it cannot read
// refuses the store, as damage does: the event it holds would read as
// absent, and be processed beside the attempt it marks.
func (st *shared) loadLeases() error {
	lo, hi := []byte{prefixLease}, []byte{prefixLease + 1}
	it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return st.leaseLoadErr(err)
	}
	now := st.now()
	b := st.db.NewBatch()
	defer b.Close()
	for ok := it.First(); ok; ok = it.Next() {
		key := string(it.Key()[1:])
		exp, val, err := decodeRecord(it.Value())
		if err == nil && !strings.HasPrefix(val, dedup.InFlightPrefix) {
			err = errBadRecord
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("file store: %s (folder %s): the lease of key %q is damaged (%v): restore the folder from a backup, or move it away to start with an empty store (deliveries of already processed events would then be processed again)",
				st.path, st.dir, key, err)
		}
		expires := unixTime(exp)
		if !now.Before(expires.Add(dedup.MarkFor)) {
			_ = b.Delete(it.Key(), nil) // a mark past its time
			continue
		}
		if _, done, err := st.read(key); err != nil { // a live record: an expired one's event may be in flight again
			it.Close()
			return st.leaseLoadErr(err)
		} else if done {
			_ = b.Delete(it.Key(), nil)
			continue
		}
		st.leases.Put(key, val, expires)
	}
	if err := it.Close(); err != nil {
		return st.leaseLoadErr(err)
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return st.leaseLoadErr(err)
	}
	return nil
}

func (st *shared) leaseLoadErr(err error) error {
	return fmt.Errorf("file store: reading the leases in %s (folder %s): %v", st.path, st.dir, err)
}

// syncLeases makes every lease change so far durable (the deletions,
// which are queued, not waited for): at exit, and after an operator's
// forget. It waits for a batch of the writer, or, once the writer has
// stopped (Destruct is under way), writes the queue itself.
func (st *shared) syncLeases() error {
	if err := st.syncWrites(); err != errFileClosed {
		return err
	}
	st.wg.Wait()
	return st.flushLeases(false)
}

// flushLeases writes the queued lease changes, synced, once the writer
// has stopped; close: no change is queued after them (the database
// closes next).
func (st *shared) flushLeases(close bool) error {
	st.closeMu.Lock()
	defer st.closeMu.Unlock()
	return st.flushLeasesLocked(close)
}

func (st *shared) flushLeasesLocked(close bool) error {
	if err := st.failure(); err != nil {
		return err // the database takes no commit after a fatal error
	}
	changes, err := st.lq.take(close)
	if err != nil || len(changes) == 0 {
		if err == errFileClosed {
			err = nil // closed: flushed then
		}
		return err
	}
	if flushLeasesHook != nil {
		flushLeasesHook()
	}
	b := st.db.NewBatch()
	defer b.Close()
	if err := writeLeases(b, changes); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// flushLeasesHook, when set (by a test), runs in flushLeases between
// taking the queue and writing it.
var flushLeasesHook func()

// stopWorkers stops the writer and the sweeper (once), and waits for
// them.
func (st *shared) stopWorkers() {
	st.stopOnce.Do(func() { close(st.stop) })
	st.wg.Wait()
}

// Destruct stops the writer and the sweepers, writes the lease changes
// still queued and closes the database; the usage pool calls it when
// the last config using the store is cleaned up.
func (st *shared) Destruct() error {
	st.stopWorkers()
	st.leases.Destruct()
	openFiles.Delete(st)
	st.parkMu.Lock()
	defer st.parkMu.Unlock()
	st.closeMu.Lock()
	defer st.closeMu.Unlock()
	if ferr := st.failure(); ferr != nil {
		// Pebble's Close waits for its flushes, which a full disk keeps
		// failing and retrying: the database is left as it is, its files
		// open until the process ends (reopening the store takes a
		// restart of Caddy, as the failure's log line says).
		st.closed = true
		return ferr
	}
	err := st.flushLeasesLocked(true)
	if err != nil {
		st.logger.Error("writing the leases at close", zap.String("path", st.path), zap.Error(err))
	}
	if cerr := st.db.Close(); err == nil {
		err = cerr
	}
	st.releaseFolder()
	st.closed = true
	return err
}

// openFiles are the stores open in this process, for the exit hook.
var openFiles sync.Map // *shared -> struct{}

// parkOpenFiles syncs the lease writes of every store still open at
// process exit: one still in use then (a commit retry pending, an old
// config draining after a reload, requests cut off by the grace period)
// is never destructed before the process ends. Its leases are in the
// database already (each claim's write is synced); the sync makes the
// deletions of its releases durable too, so that none comes back as a
// hold at the next start.
func parkOpenFiles() {
	openFiles.Range(func(k, _ any) bool {
		st := k.(*shared)
		st.parkMu.Lock()
		defer st.parkMu.Unlock()
		if !st.closed {
			if err := st.syncLeases(); err != nil {
				st.logger.Error("parking leases at exit", zap.String("path", st.path), zap.Error(err))
			}
		}
		return true
	})
}
