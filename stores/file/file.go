// Package file is the default sangho_dedup store: an embedded database
// (Pebble, in one folder), durable and safe for one Caddy process at a
// time (module http.sangho_dedup.stores.file).
//
// The files: file.go (the module, its path and config), ops.go (the
// store's operations), open.go (opening, creating, closing), lease.go
// (the leases' writes to the database), writer.go (the writer: group
// commit), sweep.go (the sweeper of done records), encoding.go (keys
// and values on disk), upgrade.go (taking over an earlier release's
// bbolt file).
package file

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

func init() {
	caddy.RegisterModule(Store{})
	cfargs.Options(Store{})
}

// Store keeps dedup state on this machine's disk, in an embedded
// key/value database (Pebble, the engine of CockroachDB) in one folder.
// It is the default store: durable across restarts, upgrades, crashes
// and power cuts with no server to run, for a single Caddy instance.
//
// A done record is on disk (its write-ahead log fsynced) before its
// commit returns. Concurrent commits share one batch and one fsync
// (group commit), so a burst does not cost one disk flush per event. A
// duplicate is one lookup (bloom filters and a bounded block cache; no
// per-record structure in memory, nothing read at open). Leases (events
// in flight) are claimed in memory, atomically, since the store is
// locked by this one process, and written to the database, synced
// before the claim returns (renewals too): after a crash, a kill -9 or a
// power cut, the next start knows which events were in flight, and a
// redelivery gets 409 until the lease's time is over. A lease whose time
// ran out is then kept for dedup.MarkFor (7 days) as the mark of an
// attempt whose fate is unknown: Get says "unknown", and a claim over it
// is dedup.Reclaimed. A release leaves no mark; a commit replaces it.
//
// The store is locked by the process that opens it: a second Caddy
// pointed at the same path refuses to start. Config reloads share the
// open store. Expired done records are read as absent from their expiry
// on, and deleted by a sweeper that reads the records a slice every 10
// seconds (a whole pass in at most about an hour), so the store stops
// growing once events expire as fast as they arrive (Pebble's
// compactions give the space back).
type Store struct {
	// Path of the store. Relative paths are relative to Caddy's working
	// directory. Default: sangho_dedup/dedup.db in Caddy's data directory
	// ($XDG_DATA_HOME/caddy, else ~/.local/share/caddy on Linux). The
	// data lives in the folder beside it named as the path with ".db"
	// replaced by ".pebble" (".pebble" appended if it has no ".db"):
	// sangho_dedup/dedup.pebble by default. A file at the path itself is
	// an earlier release's store (one bbolt file), taken over at the
	// first start and then left alone. Folders are created with mode
	// 0700.
	Path string `json:"path,omitempty"`

	state  *shared
	path   string
	dir    string // the resolved folder of the data: the store's identity
	logger *zap.Logger
	pooled bool

	// users counts the deliveries and commit retries that may still need
	// the file: its Enter and Leave implement dedup.UseCounter. Nil while
	// the store shares no file (caddy validate).
	*users
}

// users is storepool.Users under a name of this package, so that Store
// embeds it as an unexported field: its Enter and Leave are Store's
// (dedup.UseCounter).
type users = storepool.Users

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.file",
		New: func() caddy.Module { return new(Store) },
	}
}

// DefaultPath is the file store's path when none is configured
// (its data is in StoreDir of it).
func DefaultPath() string {
	return filepath.Join(caddy.AppDataDir(), "sangho_dedup", "dedup.db")
}

// Provision opens the database file, or shares the one this process
// already opened for an earlier config.
func (s *Store) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	p := s.Path
	if p == "" {
		p = DefaultPath()
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
	// The store is its folder: /x/s.db and /x/s both keep their data in
	// /x/s.pebble, and share the one open store.
	s.dir = resolvePath(StoreDir(abs))
	if validating() {
		// `caddy validate` checks the file without creating, locking or
		// writing anything: the file may be the running Caddy's, or
		// belong to the user Caddy runs as.
		return s.checkForValidation()
	}
	v, _, err := storepool.Pool.LoadOrNew(filePoolKey(s.dir), func() (caddy.Destructor, error) {
		return openShared(abs, time.Now, fileSweepEvery, s.logger)
	})
	if err != nil {
		return err
	}
	s.pooled = true
	s.users = new(users)
	s.state = v.(*shared)
	return nil
}

// Cleanup releases this config's use of the file; it is closed when no
// config uses it any more.
func (s *Store) Cleanup() error {
	if !s.pooled {
		return nil
	}
	return s.users.Release(filePoolKey(s.dir), s.logger)
}

// ParkAtExit implements dedup.ExitParker: it parks the live leases of
// every file still open in this process (see parkOpenFiles).
func (*Store) ParkAtExit() { parkOpenFiles() }

// resolvePath returns the real path of the database file at abs, every
// symlink resolved, the file's own name included: two routes that reach
// one store by different names share one open store (the lock would
// refuse the second open). A symlink to a file not created yet is
// followed to where the file will be; for a name that does not exist,
// the part of its path that exists is resolved.
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
	return resolveExisting(abs)
}

// resolveExisting resolves the symlinks of the longest part of abs that
// exists and keeps the rest as it is: a path whose folders are not made
// yet is named now as it will be once they are (a first start names the
// store as every later one does).
func resolveExisting(abs string) string {
	rest := ""
	for p := abs; ; {
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(resolved, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return abs
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

func filePoolKey(dir string) string { return "sangho_dedup.file." + dir }

// StoreDir is the folder that holds the data of the store at path:
// path with ".db" replaced by ".pebble", or ".pebble" appended.
func StoreDir(path string) string {
	return strings.TrimSuffix(path, ".db") + ".pebble"
}

// checkForValidation checks an existing store read-only: damage is an
// error; a store that the running Caddy holds is fine. A store that does
// not exist yet is created (or taken over from an earlier release's
// file, checked here) by `caddy run`.
func (s *Store) checkForValidation() error {
	dir := StoreDir(s.path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return checkLegacyForValidation(s.path, s.logger)
	}
	db, err := pebble.Open(dir, pebbleOptions(s.path, s.logger, true))
	if errors.Is(err, syscall.EAGAIN) {
		s.logger.Info("store in use, not opened for validation", zap.String("path", s.path), zap.String("folder", dir))
		return nil
	}
	if err != nil {
		return storeOpenError(s.path, dir, err)
	}
	defer db.Close()
	return checkFormat(db, s.path, dir)
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
	// store file {$DB}, DB unset, reads as store file: the default
	// store, another database (every event processed again).
	dropped, inside := cfargs.EmptyVars("store", d.File(), d.Line())
	if len(dropped) > 0 {
		return d.Err(cfargs.DroppedError("path", dropped, "set it, or write the path itself"))
	}
	if len(inside) > 0 {
		return d.Err(cfargs.InsideError("path", inside, "another store", "set it, or write the path itself"))
	}
	if d.NextArg() {
		s.Path = d.Val()
		if s.Path == "" {
			return d.Err(`file store: the path is "": leave it out for the default store, sangho_dedup/dedup.db in Caddy's data directory`)
		}
		if err := cfargs.NoMore(d, "its path"); err != nil {
			return err
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "path":
			if s.Path != "" {
				return d.Err("file store: path given more than once")
			}
			if _, inside := cfargs.EmptyVars("path", d.File(), d.Line()); len(inside) > 0 {
				return d.Err(cfargs.InsideError("path", inside, "another store", "set it, or write the path itself"))
			}
			if err := cfargs.One(d, &s.Path); err != nil {
				return err
			}
		default:
			return cfargs.Unknown(d, "file store option", s)
		}
	}
	return nil
}

// errStoreNotOpen is what a store that was only validated, or not
// provisioned, answers.
var errStoreNotOpen = errors.New("file store: the database file is not open")

// st returns the open store; one closed (Destruct begun) is refused
// before Pebble is asked, as a closed Pebble panics (an error that would
// read as damage).
func (s *Store) st() (*shared, error) {
	if s.state == nil {
		return nil, errStoreNotOpen
	}
	if s.state.isClosed() {
		return nil, errFileClosed
	}
	return s.state, nil
}

// DataID implements dedup.DataSharer: the resolved folder of the
// store (two paths that keep their data in one folder are one store).
func (s *Store) DataID() string { return "file " + s.dir }

// Interface guards
var (
	_ dedup.Store           = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
	_ caddy.Destructor      = (*shared)(nil)
	_ dedup.UseCounter      = (*Store)(nil)
	_ dedup.ExitParker      = (*Store)(nil)
	_ dedup.DataSharer      = (*Store)(nil)
)
