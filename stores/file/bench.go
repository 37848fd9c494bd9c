package file

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
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
	h := i*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	h ^= h >> 29
	h *= 0xBF58476D1CE4E5B9
	h ^= h >> 32
	g := (h ^ i) * 0x94D049BB133111EB
	return "sangho_dedup:evt_" + fmt.Sprintf("%016x%08x", h, uint32(g>>32))
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
	st, err := openFileState(path, now, sweepEvery, zap.NewNop())
	if err != nil {
		return nil, err
	}
	return &Store{state: st, path: path}, nil
}

// BenchSweep runs one sweep now, as the sweeper does.
func (s *Store) BenchSweep() (int, error) { return s.state.sweep() }

// BenchClose closes a store opened by OpenForBench.
func (s *Store) BenchClose() error { return s.state.Destruct() }

// BenchFill writes the records of a store that has run `hours` (e.g.
// 108) of a steady load whose retention keeps `live` records, ending at
// end: live×hours/retention records in all, event i at
// end − hours + i/rate, each kept `retention`, the expired ones swept
// every simulated hour (through the store's own sweep), so that the
// store ends holding `live` records after the churn of
// (hours − retention) of expiry, as one that has run that long does. It
// writes in unsynced batches of 10,000 straight to Pebble (not through
// Claim and Commit: the benchmark measures the store's reads and size,
// not the fill) and syncs once at the end. progress is called every
// simulated hour with the records written.
func BenchFill(path string, live int, end time.Time, hours, retention time.Duration, progress func(written, swept int)) error {
	var clock atomic.Int64
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	start := end.Add(-hours)
	clock.Store(start.UnixNano())
	// The sweeps of whole simulated hours are large batches: no disk
	// stall limit for them (this is the bench tool's process).
	fileWriteTimeout = time.Hour
	st, err := openFileState(path, now, 1000*time.Hour, zap.NewNop())
	if err != nil {
		return err
	}
	total := int(float64(live) * float64(hours) / float64(retention))
	step := hours / time.Duration(total)
	b := st.db.NewBatch()
	nextSweep, swept := start.Add(time.Hour), 0
	for i := range total {
		t := start.Add(time.Duration(i) * step)
		if !t.Before(nextSweep) || i == total-1 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Close()
			b = st.db.NewBatch()
			clock.Store(t.UnixNano())
			for {
				n := 0
				if err := st.write(func(tx *fileTx) error {
					var err error
					n, err = tx.sweep(20000)
					return err
				}); err != nil {
					return err
				}
				swept += n
				if n < 20000 {
					break
				}
			}
			nextSweep = nextSweep.Add(time.Hour)
			if progress != nil {
				progress(i, swept)
			}
		}
		key := BenchKey(uint64(i))
		exp := unixNano(t.Add(retention))
		if err := b.Set(doneKey(key), newDoneValue(BenchRecord(key, t)).encode(exp), nil); err != nil {
			return err
		}
		if err := b.Set(expiryKey(exp, key), nil, nil); err != nil {
			return err
		}
		if b.Count() >= 20000 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Close()
			b = st.db.NewBatch()
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	b.Close()
	if err := st.db.Flush(); err != nil {
		return err
	}
	return st.Destruct()
}

// BenchLive is the range of event numbers that BenchFill left live at
// its end: [first, total).
func BenchLive(live int, hours, retention time.Duration) (first, total int) {
	total = int(float64(live) * float64(hours) / float64(retention))
	return total - live, total
}
