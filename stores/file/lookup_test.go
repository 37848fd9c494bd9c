package file

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// TestRecentKeys: the keys marked last are remembered (all but a few),
// and keys never marked are not taken for them (a 31-bit tag in a bucket of 4: 4 in
// 2^31 per lookup, so at most one of 20,000 here, in about one run in
// 27,000).
func TestRecentKeys(t *testing.T) {
	r := newRecentKeys()
	const n = 20000
	for i := range n {
		r.mark(doneKey(fmt.Sprintf("marked-%d", i)))
	}
	// A bucket that gets a fifth key forgets one (about one bucket in
	// 65,536 at this count): a few keys at most.
	forgotten := 0
	for i := range n {
		if !r.has(doneKey(fmt.Sprintf("marked-%d", i))) {
			forgotten++
		}
	}
	if forgotten > n/1000 {
		t.Fatalf("%d of the last %d keys marked are forgotten", forgotten, n)
	}
	wrong := 0
	for i := range n {
		if r.has(doneKey(fmt.Sprintf("never-%d", i))) {
			wrong++
		}
	}
	if wrong > 1 {
		t.Fatalf("%d keys never marked taken for marked ones", wrong)
	}
	// A bucket holds 4: 4 × recentBuckets more keys make it forget
	// most of the first ones.
	for i := range 8 * recentBuckets {
		r.mark(doneKey(fmt.Sprintf("later-%d", i)))
	}
	kept := 0
	for i := range n {
		if r.has(doneKey(fmt.Sprintf("marked-%d", i))) {
			kept++
		}
	}
	if kept > n/2 {
		t.Fatalf("%d of %d early keys still remembered after %d more: the table does not forget", kept, n, 8*recentBuckets)
	}
}

// TestLookupWays: a key committed by this process is looked up with
// DB.Get (no filtered read); a new key, and a key of an earlier run
// (the same store reopened), through every level's filters; every way
// finds what is there, wherever it lies: the memtable, after a reopen
// (the log replayed), and in the last level after a full compaction.
func TestLookupWays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dedup.db")
	st := openUnclosed(t, path, time.Now)
	s, ctx := &Store{state: st}, context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "payment_intent.succeeded"}
	filtered := func(st *shared, what string, want int64, fn func()) {
		t.Helper()
		before := st.filteredReads.Load()
		fn()
		if got := st.filteredReads.Load() - before; got != want {
			t.Fatalf("%s: %d filtered reads, want %d", what, got, want)
		}
	}
	found := func(st *shared, key string) {
		t.Helper()
		if val, done, err := st.read(key); err != nil || !done || val == "" {
			t.Fatalf("%s: read = %q, %v, %v; want its record", key, val, done, err)
		}
	}
	filtered(st, "claim of a new key", 1, func() {
		if res, _, err := s.Claim(ctx, "a", "tok", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim = %v, %v", res, err)
		}
	})
	if _, err := s.Commit(ctx, "a", "tok", rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	filtered(st, "duplicate of a key just committed", 0, func() {
		if res, _, err := s.Claim(ctx, "a", "tok2", time.Minute); err != nil || res != dedup.AlreadyDone {
			t.Fatalf("claim of a done key = %v, %v", res, err)
		}
	})
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	st = openUnclosed(t, path, time.Now)
	filtered(st, "a key of the last run", 1, func() { found(st, "a") })
	if err := st.db.Compact(ctx, []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	if m := st.db.Metrics(); m.Levels[6].TablesCount == 0 {
		t.Fatalf("no table in the last level after a full compaction: %s", levelsOf(m.Levels[:]))
	}
	filtered(st, "a key of the last level", 1, func() { found(st, "a") })
	filtered(st, "a key never written", 1, func() {
		if val, done, err := st.read("b"); err != nil || done {
			t.Fatalf("read of a key never written = %q, %v, %v", val, done, err)
		}
	})
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
}

// TestNewKeyLookupReadsNoLastLevelBlock: with every record in the last
// level, lookups of new keys ask that level's filters and read none of
// its data blocks: the block cache misses stay at the tables' filter and
// index blocks, whatever the number of lookups. (DB.Get, which never
// asks the last level's filters, reads a data block for each new key:
// about one miss per lookup here, each in a block not read before.)
func TestNewKeyLookupReadsNoLastLevelBlock(t *testing.T) {
	const records = 100000
	path := lastLevelStore(t, records)
	st := openTestShared(t, path, time.Now) // an empty block cache
	m := st.db.Metrics()
	tables := m.Levels[6].TablesCount
	for l := range 6 {
		if m.Levels[l].TablesCount != 0 {
			t.Fatalf("records above the last level: %s", levelsOf(m.Levels[:]))
		}
	}
	found := func(key string) bool {
		t.Helper()
		_, done, err := st.read(key)
		if err != nil {
			t.Fatal(err)
		}
		return done
	}
	if !found(BenchKey(records / 2)) {
		t.Fatalf("a record of the last level not found")
	}
	misses0 := st.db.Metrics().BlockCache.Misses
	const lookups = 3000
	for i := range lookups {
		if found(BenchKey(uint64(benchFirstKey + i))) {
			t.Fatalf("new key %d found", i)
		}
	}
	// A filter's false positive (1 %) reads the index and a data block.
	misses := st.db.Metrics().BlockCache.Misses - misses0
	if limit := 3*tables + 3*lookups/100 + 10; misses > limit {
		t.Fatalf("%d lookups of new keys missed the block cache %d times (limit %d, %d tables in the last level): they read the last level's blocks",
			lookups, misses, limit, tables)
	}
	t.Logf("%d lookups of new keys: %d block cache misses, %d tables in the last level", lookups, misses, tables)
}

// lastLevelStore is the path of a closed store that holds done records
// of BenchKey(0) to BenchKey(records-1), live for an hour, compacted
// into the last level.
func lastLevelStore(t *testing.T, records int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dedup.db")
	st := openUnclosed(t, path, time.Now)
	// Batches of 10,000 records: under -race on a loaded machine one
	// took over the 5 s a delivery's write may wait.
	defer SetWriteTimeout(2 * time.Minute)()
	val := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "payment_intent.succeeded"}.Encode()
	for i := 0; i < records; i += 10000 {
		if err := st.write(func(tx *txn) error {
			for j := i; j < min(i+10000, records); j++ {
				if err := tx.put(BenchKey(uint64(j)), val, time.Hour); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	return path
}

func levelsOf(levels []pebble.LevelMetrics) string {
	s := ""
	for i, l := range levels {
		s += fmt.Sprintf(" L%d:%d", i, l.TablesCount)
	}
	return s
}

// TestDamagedLastLevelIsAnErrorOnBothWays: with every record in one
// last-level table whose middle (data blocks) is damaged, a claim of a
// done event is an error naming the store, or finds its record, never
// a claim of a new event, both when it goes through the filters (a
// store just opened: no key is recent) and through DB.Get (the keys
// marked as committed lately); and the store closes cleanly afterwards.
func TestDamagedLastLevelIsAnErrorOnBothWays(t *testing.T) {
	const records = 20000
	files := dirFiles(t, StoreDir(lastLevelStore(t, records)))
	n := 0
	for name, data := range files {
		if strings.HasSuffix(name, ".sst") {
			b := []byte(data)
			for i := len(b) * 3 / 10; i < len(b)*6/10; i += 512 {
				b[i] ^= 0xff
			}
			files[name] = string(b)
			n++
		}
	}
	if n == 0 {
		t.Fatal("no table written")
	}
	damaged := filepath.Join(t.TempDir(), "dedup.db")
	writeDir(t, StoreDir(damaged), files)
	for _, way := range []string{"filters", "DB.Get"} {
		st, err := openShared(damaged, time.Now, time.Hour, zap.NewNop())
		if err != nil {
			t.Fatalf("%s: the damage is in data blocks, not where an open reads: %v", way, err)
		}
		if way == "DB.Get" {
			for i := range records {
				st.recent.mark(doneKey(BenchKey(uint64(i))))
			}
		}
		s := &Store{state: st}
		errs := 0
		for i := range records {
			res, _, err := s.Claim(context.Background(), BenchKey(uint64(i)), "t2", time.Minute)
			switch {
			case err != nil:
				if !strings.Contains(err.Error(), damaged) {
					t.Fatalf("%s: error does not name the store: %v", way, err)
				}
				errs++
			case res != dedup.AlreadyDone:
				t.Fatalf("%s: claim of done event %d on a damaged table: %v", way, i, res)
			}
		}
		if errs == 0 {
			t.Fatalf("%s: no damaged block was noticed", way)
		}
		if err := st.Destruct(); err != nil {
			t.Fatalf("%s: closing after the errors: %v", way, err)
		}
		t.Logf("%s: %d of %d claims were errors", way, errs, records)
	}
}
