package file

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// The store of earlier releases: one bbolt file at the store's path.
// Bucket "events" maps a key to its expiry (8 bytes, Unix nanoseconds,
// big-endian) followed by the done record ("done:{...}"); bucket
// "expiry" indexes the keys by expiry; bucket "leases" holds, in the
// same form as events, the leases that a clean stop parked. The first
// start of this version copies the done records and the parked leases
// into the new store (createStore) and leaves the file as it was.
var (
	bucketEvents = []byte("events")
	bucketExpiry = []byte("expiry")
	bucketLeases = []byte("leases")
)

// importLegacyBatch is how many records one batch of the takeover
// carries (not synced: createStore syncs once at the end).
const importLegacyBatch = 10000

// importLegacy copies the done records and the parked leases of the
// bbolt file at path into db, and returns how many of each. The file is
// opened read-only (a shared lock, tried once: an earlier release still
// running on it is an error that says so), checked and read whole; a
// damaged page is an error naming it.
func importLegacy(path string, db *pebble.DB) (done, leases int, err error) {
	if err := checkFileSize(path); err != nil {
		return 0, 0, err
	}
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Nanosecond})
	if err != nil {
		return 0, 0, legacyOpenError(path, err)
	}
	defer bdb.Close()
	defer func() { // bbolt panics on a damaged page
		if p := recover(); p != nil {
			done, leases, err = 0, 0, fileDamaged(path, p)
		}
	}()
	if err := checkFileDB(bdb, path); err != nil {
		return 0, 0, err
	}
	b := db.NewBatch()
	defer func() { b.Close() }()
	put := func(k []byte) error {
		if b.Count() >= importLegacyBatch {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Close()
			b = db.NewBatch()
		}
		return nil
	}
	var damaged error // a record bbolt read, but not one this store wrote
	err = bdb.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) < 8 {
				continue // never written so; bbolt-era reads skipped it too
			}
			exp := unixNano(unixTime(binary.BigEndian.Uint64(v)))
			if err := put(k); err != nil {
				return err
			}
			if err := b.Set(doneKey(string(k)), doneValueOf(string(v[8:])).encode(exp), nil); err != nil {
				return err
			}
			done++
		}
		c = tx.Bucket(bucketLeases).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) < 8 {
				continue
			}
			// bbolt keeps no checksum of its data pages: a lease that
			// is not one is damage, refused here, before the new store
			// is created (loadLeases would refuse that store, and each
			// start would take the file over again).
			if !strings.HasPrefix(string(v[8:]), dedup.InFlightPrefix) {
				damaged = fmt.Errorf("the parked lease of key %q is not a lease", k)
				return damaged
			}
			if err := put(k); err != nil {
				return err
			}
			exp := unixNano(unixTime(binary.BigEndian.Uint64(v)))
			if err := b.Set(leaseKey(string(k)), encodeRecord(exp, string(v[8:])), nil); err != nil {
				return err
			}
			leases++
		}
		return nil
	})
	if damaged != nil {
		return 0, 0, fileDamaged(path, damaged)
	}
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("file store: taking over the records of %s: %v", path, err)
	}
	return done, leases, nil
}

// checkLegacyForValidation checks an earlier release's file at path, as
// `caddy validate` does before the first start of this version takes it
// over; a file in use by that release is fine.
func checkLegacyForValidation(path string, logger *zap.Logger) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("file store: cannot check %s: %v", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("file store: %s is a %s, not a store file of an earlier release (the store's data goes in the folder %s): give the store another path with `store file <path>`",
			path, fileKind(fi), StoreDir(path))
	}
	if err := checkFileSize(path); err != nil {
		return err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Nanosecond})
	if errors.Is(err, bolterrors.ErrTimeout) {
		logger.Info("store file in use, not opened for validation", zap.String("path", path))
		return nil
	}
	if err != nil {
		return legacyOpenError(path, err)
	}
	defer db.Close()
	return checkFileDB(db, path)
}

// legacyOpenError explains why bolt.Open failed, naming the file and what
// to do.
func legacyOpenError(path string, err error) error {
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
