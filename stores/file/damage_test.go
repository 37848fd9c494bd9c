package file

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// testStore creates a closed store of 2,000 done records at a new path,
// flushed to its tables (so that the folder holds a MANIFEST, tables and
// a log), and returns the path.
func testStore(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "good.db")
	st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{state: st}
	for i := range 2000 {
		rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: strings.Repeat("x", 200)}
		if _, err := s.Commit(context.Background(), "ev_"+strconv.Itoa(i), "t", rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	return path
}

// dirFiles is the content of every file in dir but Pebble's LOCK (which
// an open creates before it reads anything).
func dirFiles(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "LOCK" || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

// writeDir makes dir hold exactly files.
func writeDir(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// dirBytes is the size of the files in dir.
func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// matching returns the names in files that start with prefix.
func matching(files map[string]string, prefix string) []string {
	var names []string
	for _, n := range slices.Sorted(maps.Keys(files)) {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names
}

// A damaged store is an error that names it and says what to do, never a
// silent start from empty, and the damaged files are left as they were.
func TestFileStoreRefusesDamagedStores(t *testing.T) {
	good := dirFiles(t, StoreDir(testStore(t)))
	edit := func(f func(m map[string]string)) map[string]string {
		m := maps.Clone(good)
		f(m)
		return m
	}
	if len(matching(good, "MANIFEST-")) == 0 || len(matching(good, "marker.manifest.")) == 0 {
		t.Fatalf("the test store has no MANIFEST or no marker: %v", slices.Sorted(maps.Keys(good)))
	}
	cases := map[string]map[string]string{
		"emptied folder": {},
		"manifest marker lost": edit(func(m map[string]string) {
			for _, n := range matching(m, "marker.manifest.") {
				delete(m, n)
			}
		}),
		"MANIFEST garbage": edit(func(m map[string]string) {
			for _, n := range matching(m, "MANIFEST-") {
				m[n] = strings.Repeat("not a manifest ", 200)
			}
		}),
		"MANIFEST truncated": edit(func(m map[string]string) {
			for _, n := range matching(m, "MANIFEST-") {
				m[n] = m[n][:len(m[n])/2]
			}
		}),
		"MANIFEST gone": edit(func(m map[string]string) {
			for _, n := range matching(m, "MANIFEST-") {
				delete(m, n)
			}
		}),
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dedup.db")
			dir := StoreDir(path)
			writeDir(t, dir, files)
			st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
			if err == nil {
				st.Destruct()
				t.Fatal("opened a damaged store")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("error does not name the store and its folder: %v", err)
			}
			if after := dirFiles(t, dir); !maps.Equal(after, files) {
				t.Fatalf("the damaged store was changed: %v, was %v", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(files)))
			}
			t.Logf("%v", err)
		})
	}
	t.Run("a foreign Pebble database", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "dedup.db")
		db, err := pebble.Open(StoreDir(path), &pebble.Options{Logger: pebbleLogger{path, zap.NewNop()}})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err = openShared(path, time.Now, time.Hour, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), "not a sangho_dedup store") || !strings.Contains(err.Error(), path) {
			t.Fatalf("error = %v; want one saying it is not a sangho_dedup store, naming %s", err, path)
		}
	})
	t.Run("a file in the store folder's place", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "dedup.db")
		if err := os.WriteFile(StoreDir(path), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := openShared(path, time.Now, time.Hour, zap.NewNop()); err == nil || !strings.Contains(err.Error(), StoreDir(path)) {
			t.Fatalf("error = %v; want one that names %s", err, StoreDir(path))
		}
	})
	t.Run("a folder at the path", func(t *testing.T) {
		path := t.TempDir()
		if _, err := openShared(path, time.Now, time.Hour, zap.NewNop()); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("error = %v; want one that names %s", err, path)
		}
		if _, err := os.Lstat(StoreDir(path)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a store was created beside it: %v", err)
		}
	})
}

// A damaged file of an earlier release is refused at the takeover,
// naming it; it is left as it was and no store is created in its stead.
func TestFileStoreRefusesDamagedOldFiles(t *testing.T) {
	content, err := os.ReadFile("testdata/v2-dedup.db")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":     {},
		"truncated": content[:len(content)/2],
		"garbage":   []byte(strings.Repeat("not a database ", 2000)),
		"zeroed meta pages": func() []byte {
			b := append([]byte(nil), content...)
			clear(b[:2*4096])
			return b
		}(),
		// bbolt keeps no checksum of its data pages: a parked lease whose
		// value is damaged is found by reading it, before the new store
		// is created (it was refused after, leaving the new folder).
		"a damaged parked lease":   legacyWithLease(t, "inflighX:tok"),
		"a parked lease cut short": legacyWithLease(t, ""),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dedup.db")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
			if err == nil {
				st.Destruct()
				t.Fatal("took over a damaged file")
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the file: %v", err)
			}
			if after, _ := os.ReadFile(path); string(after) != string(data) {
				t.Fatal("the damaged file was changed")
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.pebble*")); len(left) != 0 {
				t.Fatalf("a store was left: %v", left)
			}
			t.Logf("%v", err)
		})
	}
}

// TestFileStoreDamagedTablesAreErrors: bytes changed in the middle of
// every table (the checksummed blocks of records and filters): the store
// is refused at open, or a read of a damaged block is an error naming
// it; never is an event that was done claimed as new.
func TestFileStoreDamagedTablesAreErrors(t *testing.T) {
	good := dirFiles(t, StoreDir(testStore(t)))
	tables := matching(good, "")
	damaged := maps.Clone(good)
	n := 0
	for _, name := range tables {
		if strings.HasSuffix(name, ".sst") {
			b := []byte(damaged[name])
			for i := len(b) / 4; i < len(b)*3/4; i += 512 {
				b[i] ^= 0xff
			}
			damaged[name] = string(b)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no table in %v", tables)
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	writeDir(t, StoreDir(path), damaged)
	st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
	if err != nil {
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("error does not name the store: %v", err)
		}
		return // refused at open
	}
	defer st.Destruct()
	s := &Store{state: st}
	var errs int
	for i := range 2000 {
		res, _, err := s.Claim(context.Background(), "ev_"+strconv.Itoa(i), "t2", time.Minute)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the store: %v", err)
			}
			errs++
		} else if res != dedup.AlreadyDone {
			t.Fatalf("claim of done event %d on a damaged table: %v", i, res)
		}
	}
	if errs == 0 {
		t.Fatal("no damaged block was noticed")
	}
	t.Logf("%d of 2000 claims were errors", errs)
}

// TestFileStoreFailedOpenKeepsNoLock: a store refused as damaged keeps
// no lock or handle in this process: once repaired in place, it opens
// without a restart of Caddy.
func TestFileStoreFailedOpenKeepsNoLock(t *testing.T) {
	good := dirFiles(t, StoreDir(testStore(t)))
	damaged := maps.Clone(good)
	for _, n := range matching(damaged, "MANIFEST-") {
		damaged[n] = "garbage"
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	writeDir(t, StoreDir(path), damaged)
	if st, err := openShared(path, time.Now, time.Hour, zap.NewNop()); err == nil {
		st.Destruct()
		t.Fatal("opened a store with a garbage MANIFEST")
	}
	writeDir(t, StoreDir(path), good) // the operator restores it
	st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
	if err != nil {
		if strings.Contains(err.Error(), "in use") {
			t.Fatalf("repaired store refused: the failed open kept its lock: %v", err)
		}
		t.Fatal(err)
	}
	defer st.Destruct()
	if _, ok, err := st.read("ev_7"); err != nil || !ok {
		t.Fatalf("after the repair: %v %v", ok, err)
	}
}

// TestFileStoreRefusesDamagedLeases: a lease record the store cannot
// read (damage, or a newer version's format) refuses the store at open,
// with an error that names it and says what to do, as damaged done
// records are errors; the store is never reset: the lease is still
// there, as it was. (Before, a damaged lease was skipped and deleted:
// the event it held read as absent.)
func TestFileStoreRefusesDamagedLeases(t *testing.T) {
	for name, raw := range map[string][]byte{
		"cut short":     {recordV1, 0, 0},
		"newer version": append([]byte{recordV1 + 1}, encodeRecord(unixNano(time.Now().Add(time.Hour)), "inflight:t")[1:]...),
		"not a lease":   encodeRecord(unixNano(time.Now().Add(time.Hour)), `done:{}`),
	} {
		t.Run(name, func(t *testing.T) {
			path := testStore(t)
			db, err := pebble.Open(StoreDir(path), pebbleOptions(path, zap.NewNop(), false))
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Set(leaseKey("ev_damaged"), raw, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
			if err == nil {
				st.Destruct()
				t.Fatal("opened a store with a damaged lease")
			}
			for _, want := range []string{path, StoreDir(path), "ev_damaged", "restore"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error = %v; want it to name %q", err, want)
				}
			}
			db, err = pebble.Open(StoreDir(path), pebbleOptions(path, zap.NewNop(), true))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			v, closer, err := db.Get(leaseKey("ev_damaged"))
			if err != nil {
				t.Fatalf("the damaged lease is gone: %v", err)
			}
			defer closer.Close()
			if string(v) != string(raw) {
				t.Fatalf("the damaged lease was changed: %q, was %q", v, raw)
			}
			if n, err := (&shared{db: db, path: path}).count(prefixDone); err != nil || n != 2000 {
				t.Fatalf("%d done records, %v; want the 2,000 of the store", n, err)
			}
		})
	}
}

// legacyWithLease is an earlier release's file holding one parked lease
// of value val (after its expiry), its bytes.
func legacyWithLease(t *testing.T, val string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "legacy.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	exp := binary.BigEndian.AppendUint64(nil, uint64(time.Now().Add(time.Hour).UnixNano()))
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketEvents, bucketExpiry} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		l, err := tx.CreateBucket(bucketLeases)
		if err != nil {
			return err
		}
		return l.Put([]byte("sangho_dedup:evt_1"), append(exp, val...))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
