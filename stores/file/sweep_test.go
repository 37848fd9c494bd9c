package file

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/testclock"
)

// oldExpiryKey is the index entry by expiry that the layout before the
// slice sweeper wrote beside each done record: 'x', the expiry (8
// bytes, big-endian), the key.
func oldExpiryKey(exp uint64, key string) []byte {
	k := make([]byte, 9+len(key))
	k[0] = prefixExpiry
	binary.BigEndian.PutUint64(k[1:], exp)
	copy(k[9:], key)
	return k
}

// The sweeper reads the records a slice per tick, deletes the expired
// ones it read and keeps the live ones; after a whole pass every
// expired record is gone, and the next pass reads as many slices of
// the last pass's size.
func TestFileStoreSweepsInSlices(t *testing.T) {
	old := fileSweepSlice
	fileSweepSlice = 1000
	t.Cleanup(func() { fileSweepSlice = old })
	clock := testclock.New()
	st := openTestShared(t, filepath.Join(t.TempDir(), "dedup.db"), clock.Now)
	s := &Store{state: st}
	ctx := context.Background()
	const n = 2500
	if err := st.write(func(tx *txn) error {
		for i := range n {
			ttl := time.Hour // even: expires
			if i%2 == 1 {
				ttl = 3 * time.Hour
			}
			if err := tx.put(BenchKey(uint64(i)), dedup.DoneRecord{ProcessedAt: clock.Now(), EventType: "t"}.Encode(), ttl); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	var reads, deletes []int
	for range 3 {
		r, d, err := st.sweepTick(fileSweepEvery)
		if err != nil {
			t.Fatal(err)
		}
		reads, deletes = append(reads, r), append(deletes, d)
	}
	if reads[0] != 1000 || reads[1] != 1000 || reads[2] != 500 {
		t.Fatalf("records read per tick %v, want [1000 1000 500]", reads)
	}
	if sum := deletes[0] + deletes[1] + deletes[2]; sum != n/2 || deletes[0] == 0 || deletes[1] == 0 {
		t.Fatalf("records deleted per tick %v, want %d in all, in each slice", deletes, n/2)
	}
	if got, err := s.Entries(); err != nil || got != n/2 {
		t.Fatalf("after a pass: %d records, %v; want the %d live ones", got, err, n/2)
	}
	for i := range n {
		res, _, err := s.Claim(ctx, BenchKey(uint64(i)), "x", time.Minute)
		if want := map[bool]dedup.ClaimResult{true: dedup.Claimed, false: dedup.AlreadyDone}[i%2 == 0]; err != nil || res != want {
			t.Fatalf("claim %d after the pass: %v %v, want %v", i, res, err, want)
		}
	}
	if st.sw.lastPass != n || st.sw.cursor != nil {
		t.Fatalf("after a pass: last pass %d, cursor %q; want %d, the start", st.sw.lastPass, st.sw.cursor, n)
	}
}

// sweepCase is a store on a test clock whose records, committed for a
// minute, the sweep tests then let expire.
type sweepCase struct {
	st    *shared
	s     *Store
	clock *testclock.Clock
	rec   dedup.DoneRecord
}

func newSweepCase(t *testing.T) *sweepCase {
	clock := testclock.New()
	st := openTestShared(t, filepath.Join(t.TempDir(), "dedup.db"), clock.Now)
	return &sweepCase{st: st, s: &Store{state: st}, clock: clock, rec: dedup.DoneRecord{ProcessedAt: clock.Now(), EventType: "t"}}
}

// commit commits the keys' records, for a minute.
func (c *sweepCase) commit(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := c.s.Commit(context.Background(), k, "t", c.rec, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}

// read reads the expired records, as sweepSlice does.
func (c *sweepCase) read(t *testing.T) []string {
	t.Helper()
	expired, next, _, bad, err := c.st.readExpired(nil, 1000, unixNano(c.clock.Now()))
	if err != nil || bad != nil || next != nil {
		t.Fatalf("read %q, next %q, %v %v", expired, next, bad, err)
	}
	return expired
}

// wantClaim claims each key and checks the answer.
func (c *sweepCase) wantClaim(t *testing.T, want map[string]dedup.ClaimResult) {
	t.Helper()
	for k, w := range want {
		if res, _, err := c.s.Claim(context.Background(), k, "u", time.Minute); err != nil || res != w {
			t.Errorf("claim of %s after the sweep: %v %v; want %v", k, res, err, w)
		}
	}
}

// A record read as expired but written anew before the sweeper's
// deletion reaches the writer (an event redelivered after its record
// expired, processed and committed again) is kept: the writer checks
// the expiry again.
func TestFileStoreSweepKeepsARecordWrittenAnew(t *testing.T) {
	c := newSweepCase(t)
	c.commit(t, "a", "b")
	c.clock.Advance(time.Hour)
	expired := c.read(t)
	if len(expired) != 2 {
		t.Fatalf("read %v; want both", expired)
	}
	c.commit(t, "b") // written anew meanwhile
	if n, err := c.st.deleteExpired(expired); err != nil || n != 1 {
		t.Fatalf("deleted %d, %v; want 1 (a)", n, err)
	}
	c.wantClaim(t, map[string]dedup.ClaimResult{"a": dedup.Claimed, "b": dedup.AlreadyDone})
}

// The same through the sweeper's own slice: a record committed anew
// once the slice's read has begun (its iterator open: the read finds
// the expired record) is kept.
func TestFileStoreSweepKeepsARecordWrittenAnewDuringItsSlice(t *testing.T) {
	c := newSweepCase(t)
	c.commit(t, "a", "b", "c")
	c.clock.Advance(time.Hour)
	sweepReadHook = func() { c.commit(t, "b") } // written anew meanwhile
	t.Cleanup(func() { sweepReadHook = nil })
	if n, err := c.st.sweep(); err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2 (a and c)", n, err)
	}
	sweepReadHook = nil
	c.wantClaim(t, map[string]dedup.ClaimResult{"a": dedup.Claimed, "b": dedup.AlreadyDone, "c": dedup.Claimed})
}

// A commit of a key in the same writer batch as, and before, the sweep's
// deletion of that key's expired record keeps the record: the deletion
// reads the record again in the batch, which holds the commit's write.
func TestFileStoreSweepKeepsARecordWrittenAnewInItsBatch(t *testing.T) {
	c := newSweepCase(t)
	for attempt := 0; ; attempt++ {
		key := fmt.Sprintf("evt_%d", attempt)
		c.commit(t, key)
		c.clock.Advance(time.Hour)
		all := c.read(t)
		var expired []string
		for _, k := range all {
			if k == key { // not an earlier attempt's
				expired = append(expired, k)
			}
		}
		if len(expired) != 1 {
			t.Fatalf("read %v; want %s among them", all, key)
		}
		// The writer held; the commit queued, then the deletion: the
		// writer's next batch takes both, in that order (as a rule:
		// the batch is checked below, and the case tried again if not).
		var batch []string
		hook := beforeCommitHook(func(ops []*fileOp, _ int) error {
			ours := false
			for _, op := range ops {
				ours = ours || op.lands == key
			}
			if ours && batch == nil { // the batch that carries the commit
				for _, op := range ops {
					batch = append(batch, "lands:"+op.lands)
				}
			}
			return nil
		})
		held, release := holdWriter(c.st)
		<-held
		c.st.beforeCommitHook.Store(&hook)
		committed, deletedCh := make(chan error, 1), make(chan int, 1)
		go func() {
			_, err := c.s.Commit(context.Background(), key, "t", c.rec, time.Minute)
			committed <- err
		}()
		time.Sleep(20 * time.Millisecond) // the commit waits for the writer first
		go func() {
			n, err := c.st.deleteExpired(expired)
			if err != nil {
				t.Error(err)
			}
			deletedCh <- n
		}()
		time.Sleep(20 * time.Millisecond)
		release()
		if err := <-committed; err != nil {
			t.Fatal(err)
		}
		n := <-deletedCh
		c.st.beforeCommitHook.Store(nil)
		if len(batch) != 2 || batch[0] != "lands:"+key || batch[1] != "lands:" {
			if attempt < 5 {
				t.Logf("attempt %d: the writer's batch was %q, not the commit then the deletion: again", attempt, batch)
				continue
			}
			t.Fatalf("the writer's batch was %q, not the commit then the deletion, 6 times", batch)
		}
		if n != 0 {
			t.Errorf("the deletion deleted %d records; want 0 (%s was written anew before it, in its batch)", n, key)
		}
		c.wantClaim(t, map[string]dedup.ClaimResult{key: dedup.AlreadyDone})
		return
	}
}

// A record read as expired whose expiry has not passed by the writer's
// clock when its deletion runs (the clock stepped back in between) is
// not deleted on the read's word: the writer checks it on its clock.
func TestFileStoreSweepDeletesOnTheWritersClock(t *testing.T) {
	c := newSweepCase(t)
	c.commit(t, "a")
	c.clock.Advance(time.Hour)
	expired := c.read(t)
	if len(expired) != 1 {
		t.Fatalf("read %v; want a", expired)
	}
	c.clock.Advance(-time.Hour) // stepped back
	if n, err := c.st.deleteExpired(expired); err != nil || n != 0 {
		t.Fatalf("deleted %d, %v; want 0: a has not expired by the writer's clock", n, err)
	}
	c.wantClaim(t, map[string]dedup.ClaimResult{"a": dedup.AlreadyDone})
}

// A store written by the layout before the slice sweeper (done records
// in JSON, recordV1, each with its index entry by expiry) opens, reads
// as it did, and loses its index at the first start; its expired records
// are swept.
func TestFileStoreDropsTheOldExpiryIndex(t *testing.T) {
	clock := testclock.New()
	path := filepath.Join(t.TempDir(), "dedup.db")
	st, err := openShared(path, clock.Now, time.Hour, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	b := st.db.NewBatch()
	records := map[string]time.Duration{}
	for i := range 100 {
		key := fmt.Sprintf("sangho_dedup:evt_old_%d", i)
		ttl := time.Duration(1+i%2) * time.Hour // odd ones outlive the advance below
		records[key] = ttl
		exp := unixNano(clock.Now().Add(ttl))
		rec := dedup.DoneRecord{ProcessedAt: clock.Now(), EventType: "payment_intent.succeeded", Fingerprint: encodingFP}
		if err := b.Set(doneKey(key), encodeRecord(exp, rec.Encode()), nil); err != nil {
			t.Fatal(err)
		}
		if err := b.Set(oldExpiryKey(exp, key), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	st = openTestShared(t, path, clock.Now)
	s := &Store{state: st}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := st.count(prefixExpiry)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries of the old expiry index left 10 s after the start", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	for key := range records {
		if res, val, err := s.Claim(ctx, key, "t", time.Minute); err != nil || res != dedup.AlreadyDone || dedup.Fingerprint(val) != encodingFP {
			t.Fatalf("claim %s: %v %q %v; want already done", key, res, val, err)
		}
	}
	clock.Advance(90 * time.Minute)
	if n, err := st.sweep(); err != nil || n != 50 {
		t.Fatalf("swept %d, %v; want the 50 expired records", n, err)
	}
	for key, ttl := range records {
		res, _, err := s.Claim(ctx, key, "t2", time.Minute)
		if want := map[bool]dedup.ClaimResult{true: dedup.Claimed, false: dedup.AlreadyDone}[ttl == time.Hour]; err != nil || res != want {
			t.Fatalf("claim %s after the sweep: %v %v; want %v", key, res, err, want)
		}
	}
}

// The sweeper goes on after a restart from where it was: a Caddy
// restarted more often than a pass takes still sweeps the records at
// the end of the keys.
func TestFileStoreSweepGoesOnAfterARestart(t *testing.T) {
	old := fileSweepSlice
	fileSweepSlice = 10
	t.Cleanup(func() { fileSweepSlice = old })
	clock := testclock.New()
	path := filepath.Join(t.TempDir(), "dedup.db")
	st, err := openShared(path, clock.Now, time.Hour, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.write(func(tx *txn) error {
		for i := range 30 {
			ttl := time.Minute
			if i < 10 { // the first slice: live records
				ttl = 3 * time.Hour
			}
			if err := tx.put(fmt.Sprintf("k%02d", i), dedup.DoneRecord{ProcessedAt: clock.Now()}.Encode(), ttl); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if _, d, err := st.sweepTick(fileSweepEvery); err != nil || d != 0 {
		t.Fatalf("first tick deleted %d, %v; want none (its slice is live)", d, err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // restarts, one tick each
		st, err = openShared(path, clock.Now, time.Hour, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // the sweeper has read the cursor
			st.sw.mu.Lock()
			c := st.sw.cursor
			st.sw.mu.Unlock()
			if c != nil || time.Now().After(deadline) {
				break
			}
		}
		if _, d, err := st.sweepTick(fileSweepEvery); err != nil || d != 10 {
			t.Fatalf("tick after a restart deleted %d, %v; want 10 more", d, err)
		}
		if err := st.Destruct(); err != nil {
			t.Fatal(err)
		}
	}
	st = openTestShared(t, path, clock.Now)
	if n, err := st.count(prefixDone); err != nil || n != 10 {
		t.Fatalf("%d records left after three ticks over three starts, %v; want the 10 live ones", n, err)
	}
}
