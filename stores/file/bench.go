package file

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// What the benchmark tool (cmd/sangho-bench -filescale) needs of the
// store, and nothing a config can reach: a store on its own clock, the
// sweep on call, and a bulk fill.

// BenchKey is the i-th event key of the benchmarks: random-looking, as
// senders' event IDs are ("sangho_dedup:evt_" and 24 hex digits of a
// hash of i).
func BenchKey(i uint64) string {
	h, g := benchKeyHash(i)
	return "sangho_dedup:evt_" + fmt.Sprintf("%016x%08x", h, g)
}

// benchKeyHash is the hash BenchKey writes in hex: the keys sort as
// (h, g) do.
func benchKeyHash(i uint64) (h uint64, g uint32) {
	h = i*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	h ^= h >> 29
	h *= 0xBF58476D1CE4E5B9
	h ^= h >> 32
	return h, uint32(((h ^ i) * 0x94D049BB133111EB) >> 32)
}

// BenchRecord is the done record of a benchmark's event key at t, as
// the handler writes it: the event's ID and type, and a fingerprint (16
// random-looking bytes in hex, as a hash of a body is).
func BenchRecord(key string, t time.Time) dedup.DoneRecord {
	h := sha256.Sum256([]byte(key))
	return dedup.DoneRecord{ProcessedAt: t, EventType: "payment_intent.succeeded",
		EventID: strings.TrimPrefix(key, "sangho_dedup:"), Fingerprint: hex.EncodeToString(h[:16])}
}

// OpenForBench opens the store at path as Provision does, on the clock
// now, with the store's sweeper every sweepEvery.
func OpenForBench(path string, now func() time.Time, sweepEvery time.Duration) (*Store, error) {
	st, err := openShared(path, now, sweepEvery, zap.NewNop())
	if err != nil {
		return nil, err
	}
	return &Store{state: st, path: path}, nil
}

// BenchCacheSize sets the block cache of the stores opened from now on
// (0: the default), and returns the size they will have.
func BenchCacheSize(bytes int64) int64 {
	if bytes > 0 {
		fileCacheSize = bytes
	}
	return fileCacheSize
}

// BenchSweepTick runs one tick of the sweeper now (one slice of the
// records, as every 10 s), and returns how many records it read and
// deleted.
func (s *Store) BenchSweepTick() (read, deleted int, err error) {
	return s.state.sweepTick(fileSweepEvery)
}

// BenchSweepAll runs a whole pass of the sweeper now.
func (s *Store) BenchSweepAll() (int, error) { return s.state.sweep() }

// BenchSweepEvery is the sweeper's tick.
const BenchSweepEvery = fileSweepEvery

// BenchSweepPass is how long the sweeper takes for a whole pass over
// live records.
func BenchSweepPass(live int) time.Duration {
	return time.Duration(max(1, live/fileSweepSlice)) * fileSweepEvery
}

// BenchClose closes a store opened by OpenForBench.
func (s *Store) BenchClose() error { return s.state.Destruct() }

// BenchMemory says where the store's memory is: Pebble's block cache
// (its C-allocated bytes in use), its memtables, and the Go heap.
func (s *Store) BenchMemory() string {
	m := s.state.db.Metrics()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return fmt.Sprintf("block cache %.0f MiB in use (%d hits, %d misses), memtables %.0f MiB (%d), open tables %d, Go heap in use %.0f MiB (from the OS %.0f MiB), %s",
		float64(m.BlockCache.Size)/(1<<20), m.BlockCache.Hits, m.BlockCache.Misses, float64(m.MemTable.Size)/(1<<20), m.MemTable.Count,
		m.FileCache.TableCount, float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20), procRSS())
}

// procRSS is the process's resident memory by kind (Linux): anonymous
// (heaps: Go's and C's, where Pebble's cache and memtables are) and
// file-backed (the binary).
func procRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return ""
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "RssAnon:") || strings.HasPrefix(l, "RssFile:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// BenchTables is the number of Pebble's tables and the bytes of their
// index and filter blocks: what the block cache must hold for a lookup
// to read at most one data block from disk.
func (s *Store) BenchTables() (tables int, index, filter uint64, err error) {
	levels, err := s.state.db.SSTables(pebble.WithProperties())
	if err != nil {
		return 0, 0, 0, err
	}
	for _, l := range levels {
		for _, t := range l {
			tables++
			if t.Properties != nil {
				index += t.Properties.IndexSize
				filter += t.Properties.FilterSize
			}
		}
	}
	return tables, index, filter, nil
}

// BenchFill builds, at a new path, the store of a steady load that has
// run `hours` (e.g. 108) with a retention that keeps `live` records,
// ending at end: live×hours/retention events in all, event i at
// end − hours + i×retention/live, each kept `retention`. It is a bulk
// loader for benchmarks, not the store's write path: straight to
// Pebble, in unsynced batches, without Pebble's write-ahead log.
//
//  1. The events of the first `retention` (the first `live` events)
//     are written in key order: Pebble moves the sorted tables down
//     without rewriting them (a fresh load, fast).
//  2. The rest, hours − retention of them (36 h of 108), are written
//     in time order (random keys), and every simulated hour the
//     records expired by then are deleted, as the sweeper does: the
//     churn of expiry and reuse, through Pebble's compactions.
//
// At the end every record expired at end is deleted, the memtable is
// flushed, and the fill waits (up to 30 minutes) for Pebble's
// compactions to finish, as they do in a store that runs at this load
// (no debt left, or none under way for 10 s: the debt left is given to
// progress); then the store is closed. progress is called every simulated hour.
func BenchFill(path string, live int, end time.Time, hours, retention time.Duration, progress func(phase string, written, deleted int)) error {
	dir := StoreDir(path)
	if _, err := os.Lstat(dir); err == nil {
		return fmt.Errorf("bench fill: %s exists: the fill builds a new store", dir)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := createStore(path, dir, zap.NewNop()); err != nil {
		return err
	}
	opts := pebbleOptions(path, zap.NewNop(), false)
	opts.DisableWAL = true
	opts.MemTableSize = 64 << 20
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return err
	}
	defer func() {
		if db != nil {
			db.Close()
		}
	}()
	total := int(float64(live) * float64(hours) / float64(retention))
	start := end.Add(-hours)
	at := func(i int) time.Time { return start.Add(time.Duration(float64(i) * float64(hours) / float64(total))) }
	b := db.NewBatch()
	flush := func(force bool) error {
		if !force && b.Count() < 20000 {
			return nil
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		b.Close()
		b = db.NewBatch()
		return nil
	}
	set := func(i int) error {
		key := BenchKey(uint64(i))
		t := at(i)
		if err := b.Set(doneKey(key), newDoneValue(BenchRecord(key, t)).encode(unixNano(t.Add(retention))), nil); err != nil {
			return err
		}
		return flush(false)
	}
	// 1. the first `live` events, in key order
	type ki struct {
		h uint64
		g uint32
		i uint32
	}
	first := min(live, total)
	order := make([]ki, first)
	for i := range order {
		h, g := benchKeyHash(uint64(i))
		order[i] = ki{h, g, uint32(i)}
	}
	slices.SortFunc(order, func(a, b ki) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(a.g, b.g)
	})
	for n, k := range order {
		if err := set(int(k.i)); err != nil {
			return err
		}
		if progress != nil && n%1000000 == 0 {
			progress("load in key order", n, 0)
		}
	}
	order = nil
	// 2. the rest in time order, the expired deleted every simulated hour
	deleted := 0
	expireTo := func(now time.Time) error {
		// event j has expired at now once at(j) + retention <= now
		for ; deleted < total && !at(deleted).Add(retention).After(now); deleted++ {
			if err := b.Delete(doneKey(BenchKey(uint64(deleted))), nil); err != nil {
				return err
			}
			if err := flush(false); err != nil {
				return err
			}
		}
		return nil
	}
	nextSweep := at(first).Truncate(time.Hour).Add(time.Hour)
	for i := first; i < total; i++ {
		if t := at(i); !t.Before(nextSweep) {
			if err := expireTo(t); err != nil {
				return err
			}
			nextSweep = nextSweep.Add(time.Hour)
			if progress != nil {
				progress("churn", i, deleted)
			}
		}
		if err := set(i); err != nil {
			return err
		}
	}
	if err := expireTo(end); err != nil {
		return err
	}
	if err := flush(true); err != nil {
		return err
	}
	if err := db.Flush(); err != nil {
		return err
	}
	// Until the compactions are done: no debt, or none for 10 s (none
	// under way, none started and ended between two looks, and the
	// tables' statistics, which may start compactions of deletions,
	// collected): Pebble leaves a debt below its thresholds alone, for
	// good when no write comes (a fill waited 30 minutes on one, idle).
	idle, count := 0, int64(-1)
	for deadline := time.Now().Add(30 * time.Minute); time.Now().Before(deadline) && idle < 10; time.Sleep(time.Second) {
		m := db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Compact.EstimatedDebt == 0 {
			break
		}
		if m.Compact.NumInProgress == 0 && m.Compact.Count == count &&
			m.Table.InitialStatsCollectionComplete && m.Table.PendingStatsCollectionCount == 0 {
			idle++
		} else {
			idle = 0
		}
		count = m.Compact.Count
		if progress != nil {
			progress("compactions", total, deleted)
		}
	}
	if progress != nil {
		progress(fmt.Sprintf("compactions done, %.1f MiB of compaction debt left", float64(db.Metrics().Compact.EstimatedDebt)/(1<<20)), total, deleted)
	}
	err = db.Close()
	db = nil
	if err != nil {
		return err
	}
	return os.WriteFile(benchFillFile(path), []byte(fmt.Sprintf("%d %d\n", end.UnixNano(), live)), 0o600)
}

func benchFillFile(path string) string { return StoreDir(path) + ".fill" }

// BenchFillEnd is the end of the simulated load that BenchFill wrote at
// path: the store's clock then.
func BenchFillEnd(path string) (end time.Time, live int, err error) {
	b, err := os.ReadFile(benchFillFile(path))
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("%v (a store made by -filescale fill has it)", err)
	}
	var ns int64
	if _, err := fmt.Sscan(string(b), &ns, &live); err != nil {
		return time.Time{}, 0, fmt.Errorf("%s: %v", benchFillFile(path), err)
	}
	return time.Unix(0, ns), live, nil
}

// BenchLive is the range of event numbers that BenchFill left live at
// its end: [first, total).
func BenchLive(live int, hours, retention time.Duration) (first, total int) {
	total = int(float64(live) * float64(hours) / float64(retention))
	return total - live, total
}
