package memtable

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/testclock"
)

func TestSweeper(t *testing.T) {
	clock := testclock.New()
	st := New(clock.Now, time.Hour)
	defer st.Destruct()
	st.Claim("a", "t", time.Second)
	st.Claim("b", "t", time.Hour)
	st.Commit("c", "t", "done:{}", 2*time.Second)
	if n := st.Len(); n != 3 {
		t.Fatalf("size = %d", n)
	}
	clock.Advance(3 * time.Second)
	if n := st.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1 (the done record; the expired lease is a mark)", n)
	}
	if n := st.Len(); n != 2 {
		t.Fatalf("size after sweep = %d, want 2", n)
	}
	// Marks are swept once MarkFor is over: memory stays bounded.
	clock.Advance(dedup.MarkFor)
	if n := st.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1 (the mark past MarkFor)", n)
	}
	if n := st.Len(); n != 1 {
		t.Fatalf("size after sweep = %d, want 1 (the live lease)", n)
	}
}

func TestSweeperRunsAndStops(t *testing.T) {
	st := New(time.Now, 10*time.Millisecond)
	st.Commit("a", "t", "done:{}", time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for st.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired entry within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st.Destruct() // returns only once the sweeper goroutine has exited
	select {
	case <-st.done:
	default:
		t.Fatal("sweeper still running after Destruct")
	}
}

// failing is a journal whose writes fail while fail is set.
type failing struct {
	fail    bool
	calls   []string
	pending map[string]bool
}

func (j *failing) Pending(key string) bool { return j.pending[key] }

func (j *failing) Set(key, val string, _ time.Time) error {
	j.calls = append(j.calls, "set "+key+" "+val)
	if j.fail {
		return errors.New("disk full")
	}
	return nil
}

func (j *failing) Delete(keys ...string) error {
	j.calls = append(j.calls, "delete "+strings.Join(keys, ","))
	if j.fail {
		return errors.New("disk full")
	}
	return nil
}

func (j *failing) Sync() error { j.calls = append(j.calls, "sync"); return nil }

// TestJournal: every change to a lease goes to the journal first (a
// claim's and a renewal's then synced); one the journal refuses is not
// made, and its error is the caller's. Extend and the lookups write
// nothing.
func TestJournal(t *testing.T) {
	clock := testclock.New()
	j := &failing{}
	st := NewJournaled(clock.Now, time.Hour, j)
	defer st.Destruct()
	if res, _, err := st.Claim("k", "t1", time.Second); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	if ok, err := st.Renew("k", "t1", time.Second); err != nil || !ok {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	st.Extend("k", "t1", time.Hour)
	st.Lookup("k")
	want := []string{"set k inflight:t1", "sync", "set k inflight:t1", "sync"}
	if !slices.Equal(j.calls, want) {
		t.Fatalf("journal = %q, want %q", j.calls, want)
	}
	j.fail = true
	if ok, err := st.Release("k", "t1"); err == nil || ok {
		t.Fatalf("release with the journal failing = %v, %v; want the error", ok, err)
	}
	if res, _, err := st.Claim("new", "t1", time.Second); err == nil {
		t.Fatalf("claim with the journal failing = %v, nil; want the error", res)
	}
	if _, ok := st.Lookup("new"); ok {
		t.Fatal("a claim the journal refused left a lease")
	}
	if e, ok := st.Lookup("k"); !ok || e.Value != "inflight:t1" {
		t.Fatalf("a release the journal refused deleted the lease: %+v", e)
	}
	clock.Advance(2*time.Hour + dedup.MarkFor)
	if n := st.Sweep(); n != 0 || st.Len() != 1 {
		t.Fatalf("swept %d with the journal failing; want the mark kept for the next sweep", n)
	}
	j.fail = false
	if n := st.Sweep(); n != 1 || st.Len() != 0 {
		t.Fatalf("swept %d; want the mark past MarkFor", n)
	}
}

// SettleWritten drops token's lease (live or its mark) as Settle does,
// without telling the journal (the store deleted it with the record);
// Settle tells it. Another token's live lease stays with both.
func TestSettleWritten(t *testing.T) {
	clock := testclock.New()
	j := &failing{}
	st := NewJournaled(clock.Now, time.Hour, j)
	defer st.Destruct()
	for _, k := range []string{"a", "b", "c"} {
		if res, _, err := st.Claim(k, "t1", time.Second); err != nil || res != dedup.Claimed {
			t.Fatalf("claim %s = %v, %v", k, res, err)
		}
	}
	j.calls = nil
	if ok, err := st.SettleWritten("a", "t1"); !ok || err != nil {
		t.Fatalf("SettleWritten = %v, %v; want the lease dropped", ok, err)
	}
	clock.Advance(2 * time.Second) // b's lease is a mark now
	if ok, err := st.SettleWritten("b", "t1"); !ok || err != nil {
		t.Fatalf("SettleWritten of the mark = %v, %v; want it dropped", ok, err)
	}
	if len(j.calls) != 0 {
		t.Fatalf("SettleWritten told the journal %q", j.calls)
	}
	if ok, err := st.Settle("c", "t1"); !ok || err != nil {
		t.Fatalf("Settle = %v, %v", ok, err)
	}
	if want := []string{"delete c"}; !slices.Equal(j.calls, want) {
		t.Fatalf("journal = %q, want %q", j.calls, want)
	}
	for _, k := range []string{"a", "b", "c"} {
		if e, ok := st.Lookup(k); ok {
			t.Fatalf("%s still holds %+v", k, e)
		}
	}
	if res, _, err := st.Claim("d", "t2", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim d = %v, %v", res, err)
	}
	if ok, err := st.SettleWritten("d", "t1"); ok || err != nil {
		t.Fatalf("SettleWritten of another token's live lease = %v, %v; want it kept", ok, err)
	}
	if _, ok := st.Lookup("d"); !ok {
		t.Fatal("another token's live lease was dropped")
	}
	// Written again after the write the store deleted: that write is
	// pending in the journal, behind the deletion, so the drop goes to
	// the journal.
	if res, _, err := st.Claim("e", "t1", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim e = %v, %v", res, err)
	}
	if ok, err := st.Renew("e", "t1", time.Minute); !ok || err != nil {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	j.pending = map[string]bool{"e": true} // the renewal's write, queued
	j.calls = nil
	if ok, err := st.SettleWritten("e", "t1"); !ok || err != nil {
		t.Fatalf("SettleWritten after a renewal = %v, %v; want the lease dropped", ok, err)
	}
	if want := []string{"delete e"}; !slices.Equal(j.calls, want) {
		t.Fatalf("SettleWritten after a renewal: journal = %q, want %q", j.calls, want)
	}
	if _, ok := st.Lookup("e"); ok {
		t.Fatal("e still holds its lease")
	}
}

// Settles rises with every Settle of a key, whether or not it drops a
// lease, and with no other change; HoldsOnce tells token's lease, live or
// its mark, from anyone else's.
func TestSettlesAndHolds(t *testing.T) {
	clock := testclock.New()
	st := New(clock.Now, time.Hour)
	defer st.Destruct()
	st.Claim("k", "t", time.Second)
	n0 := st.Settles("k")
	if !holds(st, "k", "t") || holds(st, "k", "u") || holds(st, "other", "t") {
		t.Fatal("HoldsOnce: want only t's lease on k")
	}
	st.Renew("k", "t", time.Second)
	st.Claim("j", "t", time.Second)
	st.Release("j", "t")
	if n := st.Settles("k"); n != n0 {
		t.Fatalf("Settles moved from %d to %d without a Settle", n0, n)
	}
	if ok, _ := st.Settle("k", "u"); ok {
		t.Fatal("another token's Settle dropped t's live lease")
	}
	if n := st.Settles("k"); n == n0 {
		t.Fatal("Settles did not rise with a Settle that dropped nothing")
	}
	clock.Advance(2 * time.Second) // t's lease is a mark now
	if !holds(st, "k", "t") {
		t.Fatal("HoldsOnce: t's mark is still t's")
	}
	n1 := st.Settles("k")
	if ok, _ := st.Settle("k", "t"); !ok {
		t.Fatal("t's Settle did not drop its mark")
	}
	if st.Settles("k") == n1 || holds(st, "k", "t") {
		t.Fatal("after t's Settle: want the count raised and no lease held")
	}
}

// SettledSince is true while a record of the shard is landing, and
// after a Settle; false otherwise.
func TestSettledSince(t *testing.T) {
	st := New(time.Now, time.Hour)
	defer st.Destruct()
	n := st.Settles("k")
	if st.SettledSince("k", n) {
		t.Fatal("SettledSince with nothing landing or settled")
	}
	st.Landing("k")
	if !st.SettledSince("k", n) {
		t.Fatal("SettledSince false while k's record is landing")
	}
	st.Settle("k", "t")
	st.Landed("k")
	if !st.SettledSince("k", n) {
		t.Fatal("SettledSince false after k's record landed and settled")
	}
	if st.SettledSince("k", st.Settles("k")) {
		t.Fatal("SettledSince true from a count taken after the landing")
	}
}

// HoldsOnce says "once" only for a lease that is its key's one write to
// the journal since the key's last deletion there: a new claim, or a
// claim after a release, a sweep or a settle, and only once per write. A
// renewal, a claim over a mark (its write is still in the journal), or a
// lease put back at the store's start (what lies behind it on disk is
// unknown) has two writes behind it, or may. A table without a journal
// never says it.
func TestHoldsOnce(t *testing.T) {
	clock := testclock.New()
	j := &failing{pending: map[string]bool{}}
	st := NewJournaled(clock.Now, time.Hour, j)
	defer st.Destruct()
	claim := func(key, token string) {
		t.Helper()
		if _, _, err := st.Claim(key, token, time.Second); err != nil {
			t.Fatalf("claim %s: %v", key, err)
		}
	}
	check := func(key, token string, wantHeld, wantOnce bool) {
		t.Helper()
		if held, once := st.HoldsOnce(key, token); held != wantHeld || once != wantOnce {
			t.Fatalf("HoldsOnce(%s, %s) = %v, %v; want %v, %v", key, token, held, once, wantHeld, wantOnce)
		}
	}
	claim("new", "t1")
	check("new", "t2", false, false)
	st.Extend("new", "t1", time.Minute) // in memory only: no write
	check("new", "t1", true, true)
	check("new", "t1", true, false) // told once

	claim("renewed", "t1")
	if ok, err := st.Renew("renewed", "t1", time.Minute); !ok || err != nil {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	check("renewed", "t1", true, false)

	claim("released", "t1")
	if ok, err := st.Release("released", "t1"); !ok || err != nil {
		t.Fatalf("release = %v, %v", ok, err)
	}
	claim("released", "t2")
	check("released", "t2", true, true)

	claim("marked", "t1")
	claim("settled", "t1")
	if ok, err := st.Settle("settled", "t1"); !ok || err != nil {
		t.Fatalf("settle = %v, %v", ok, err)
	}
	claim("settled", "t2")
	check("settled", "t2", true, true)
	if ok, err := st.SettleWritten("settled", "t2"); !ok || err != nil {
		t.Fatalf("SettleWritten = %v, %v", ok, err)
	}
	claim("settled", "t3")
	check("settled", "t3", true, true)
	clock.Advance(2 * time.Second) // marked's lease is a mark now
	check("marked", "t1", true, true)
	if res, _, err := st.Claim("marked", "t2", time.Minute); err != nil || res != dedup.Reclaimed {
		t.Fatalf("claim over the mark = %v, %v", res, err)
	}
	check("marked", "t2", true, false)

	// Past MarkFor, not swept yet: the write is still in the journal.
	claim("stale", "t1")
	claim("swept", "t1")
	clock.Advance(time.Second + dedup.MarkFor)
	claim("stale", "t2")
	check("stale", "t2", true, false)
	clock.Advance(2 * dedup.MarkFor)
	st.Sweep() // deletes swept's mark (and the rest) from the journal
	claim("swept", "t2")
	check("swept", "t2", true, true)

	st.Put("loaded", "inflight:t1", clock.Now().Add(time.Minute))
	check("loaded", "t1", true, false)

	// A change of the key pending in the journal (written again after
	// the asking write took the journal's changes) lands after it: not
	// once, and SettleWritten records the drop.
	claim("pending", "t1")
	j.pending["pending"] = true
	if held, once := st.HoldsOnce("pending", "t1"); !held || once {
		t.Fatalf("HoldsOnce with a change pending = %v, %v; want true, false", held, once)
	}
	j.calls = nil
	if ok, err := st.SettleWritten("pending", "t1"); !ok || err != nil {
		t.Fatalf("SettleWritten = %v, %v", ok, err)
	}
	if want := []string{"delete pending"}; !slices.Equal(j.calls, want) {
		t.Fatalf("SettleWritten with a change pending: journal = %q, want %q", j.calls, want)
	}

	plain := New(clock.Now, time.Hour)
	defer plain.Destruct()
	if _, _, err := plain.Claim("k", "t1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if held, once := plain.HoldsOnce("k", "t1"); !held || once {
		t.Fatalf("without a journal HoldsOnce = %v, %v; want true, false", held, once)
	}
}

// holds reports whether key holds token's lease (HoldsOnce).
func holds(st *Table, key, token string) bool {
	held, _ := st.HoldsOnce(key, token)
	return held
}

// TestUntake: Untake undoes a Take that wrote. Over a mark (Reclaimed)
// it puts the mark back, value and time, recorded in the journal; over
// nothing it deletes the lease; the key holding another token's lease,
// or nothing, is left as it is.
func TestUntake(t *testing.T) {
	clock := testclock.New()
	j := &failing{}
	st := NewJournaled(clock.Now, time.Hour, j)
	defer st.Destruct()
	if res, _, _, err := st.Take("k", "t1", time.Second); err != nil || res != dedup.Claimed {
		t.Fatalf("t1's take: %v %v", res, err)
	}
	clock.Advance(2 * time.Second) // t1's lease is a mark
	mark, _ := st.Lookup("k")
	res, found, _, err := st.Take("k", "t2", time.Minute)
	if err != nil || res != dedup.Reclaimed || found != "inflight:t1" {
		t.Fatalf("t2's take over the mark: %v %q %v", res, found, err)
	}
	if err := st.Untake("k", "t3"); err != nil { // not t3's: nothing
		t.Fatal(err)
	}
	if e, _ := st.Lookup("k"); e.Value != "inflight:t2" {
		t.Fatalf("Untake of another token changed the key: %+v", e)
	}
	j.calls = nil
	if err := st.Untake("k", "t2"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("k"); !ok || e != mark {
		t.Fatalf("after t2's Untake: %+v %v, want t1's mark %+v", e, ok, mark)
	}
	if want := []string{"set k inflight:t1"}; !slices.Equal(j.calls, want) {
		t.Fatalf("journal = %q, want %q", j.calls, want)
	}
	if res, _, _, _ := st.Take("fresh", "t4", time.Minute); res != dedup.Claimed {
		t.Fatalf("fresh take: %v", res)
	}
	if err := st.Untake("fresh", "t4"); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Lookup("fresh"); ok {
		t.Fatal("Untake of a take over nothing left a lease")
	}
	// A retried take (t5's own live lease) lives ttl again. An Untake
	// then leaves t5's lease, whichever of the two takes it undoes (their
	// Untakes may come in any order); a second Untake drops it.
	if res, _, _, err := st.Take("again", "t5", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("t5's take: %v %v", res, err)
	}
	first, _ := st.Lookup("again")
	clock.Advance(time.Second)
	if res, _, wrote, err := st.Take("again", "t5", time.Hour); err != nil || res != dedup.Claimed || !wrote {
		t.Fatalf("t5's retried take: %v %v %v, want claimed, written", res, wrote, err)
	}
	if e, _ := st.Lookup("again"); !e.ExpiresAt.Equal(clock.Now().Add(time.Hour)) {
		t.Fatalf("after the retried take: %+v, want the lease for an hour from now", e)
	}
	retaken, _ := st.Lookup("again")
	if err := st.Untake("again", "t5"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("again"); !ok || e != retaken {
		t.Fatalf("after one Untake: %+v %v, want t5's lease %+v", e, ok, retaken)
	}
	if err := st.Untake("again", "t5"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("again"); ok {
		t.Fatalf("after both takes' Untake: %+v, want nothing (t5's first lease was %+v)", e, first)
	}

	// Two takes of t6 in flight on one key: the first over t1's mark
	// (Reclaimed), the second a retry over t6's own lease. Both fail, and
	// are undone: the mark comes back.
	if _, _, _, err := st.Take("marked", "t1", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	mark, _ = st.Lookup("marked")
	if res, _, _, err := st.Take("marked", "t6", time.Minute); err != nil || res != dedup.Reclaimed {
		t.Fatalf("t6's take over the mark: %v %v", res, err)
	}
	if res, _, _, err := st.Take("marked", "t6", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("t6's retried take: %v %v", res, err)
	}
	for range 2 {
		if err := st.Untake("marked", "t6"); err != nil {
			t.Fatal(err)
		}
	}
	if e, ok := st.Lookup("marked"); !ok || e != mark {
		t.Fatalf("after both takes' Untake: %+v %v, want t1's mark %+v", e, ok, mark)
	}

	// Three takes of t8 (a claim, two retries): two undone, in any
	// order, leave t8's lease, since the third may hold the key; the
	// last Untake drops it.
	if _, _, _, err := st.Take("thrice", "t8", time.Minute); err != nil {
		t.Fatal(err)
	}
	thrice, _ := st.Lookup("thrice")
	for range 2 {
		clock.Advance(time.Second)
		if res, _, _, err := st.Take("thrice", "t8", time.Hour); err != nil || res != dedup.Claimed {
			t.Fatalf("t8's retried take: %v %v", res, err)
		}
	}
	for range 2 {
		if err := st.Untake("thrice", "t8"); err != nil {
			t.Fatal(err)
		}
	}
	if e, ok := st.Lookup("thrice"); !ok || e.Value != thrice.Value || e.Mark {
		t.Fatalf("after two takes' Untake: %+v %v, want t8's lease", e, ok)
	}
	if err := st.Untake("thrice", "t8"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("thrice"); ok {
		t.Fatalf("after the three takes' Untake: %+v, want nothing", e)
	}

	// The file store's commit extends its lease (Extend) until its record
	// is on disk; a retried take undone meanwhile keeps that extension.
	if _, _, _, err := st.Take("extended", "t9", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := st.Take("extended", "t9", time.Minute); err != nil {
		t.Fatal(err)
	}
	if !st.Extend("extended", "t9", time.Hour) {
		t.Fatal("t9's lease not extended")
	}
	extended, _ := st.Lookup("extended")
	if err := st.Untake("extended", "t9"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("extended"); !ok || e != extended {
		t.Fatalf("after an Extend and the retry's Untake: %+v %v, want t9's extended lease %+v", e, ok, extended)
	}

	// A take over the token's own mark (Claimed) is a retried take too:
	// the first take's sync may have stalled past its ttl, and be undone
	// after the retry succeeded. That Untake leaves the retry's lease,
	// live: another token is answered in flight, not handed the key as
	// a mark while the retry's delivery is on its way to the backend.
	if _, _, _, err := st.Take("stalled", "t11", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second) // the first take's sync still stalled
	if res, _, _, err := st.Take("stalled", "t11", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("t11's take over its own mark: %v %v, want claimed", res, err)
	}
	retried, _ := st.Lookup("stalled")
	if err := st.Untake("stalled", "t11"); err != nil { // the first take fails at last
		t.Fatal(err)
	}
	if e, ok := st.Lookup("stalled"); !ok || e != retried || e.Mark {
		t.Fatalf("after the stalled first take's Untake: %+v %v, want the retry's live lease %+v", e, ok, retried)
	}
	if res, _, _, err := st.Take("stalled", "t12", time.Minute); err != nil || res != dedup.InFlight {
		t.Fatalf("another token's take while the retry holds the key: %v %v, want in flight", res, err)
	}

	// If it is the retry over the token's own mark that fails, the key
	// stays the token's: its lease until the retry's ttl ends, a mark
	// after (the first take may hold it). Never unmarked, never another
	// token's meanwhile.
	if _, _, _, err := st.Take("own mark", "t10", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if res, _, _, err := st.Take("own mark", "t10", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("t10's take over its own mark: %v %v, want claimed", res, err)
	}
	if err := st.Untake("own mark", "t10"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("own mark"); !ok || e.Value != "inflight:t10" || e.Mark {
		t.Fatalf("after the Untake of a take over its own mark: %+v %v, want t10's lease", e, ok)
	}
	clock.Advance(time.Minute)
	if e, ok := st.Lookup("own mark"); !ok || e.Value != "inflight:t10" || !e.Mark {
		t.Fatalf("after the retry's ttl: %+v %v, want t10's mark", e, ok)
	}

	// Over another token's mark: t13's take over t1's mark (Reclaimed),
	// then t13's retry over its own mark, both undone: t1's mark comes
	// back, the one the first take replaced.
	if _, _, _, err := st.Take("chain", "t1", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	t1Mark, _ := st.Lookup("chain")
	if res, _, _, err := st.Take("chain", "t13", time.Second); err != nil || res != dedup.Reclaimed {
		t.Fatalf("t13's take over t1's mark: %v %v", res, err)
	}
	clock.Advance(2 * time.Second)
	if res, _, _, err := st.Take("chain", "t13", time.Second); err != nil || res != dedup.Claimed {
		t.Fatalf("t13's retry over its own mark: %v %v", res, err)
	}
	for range 2 {
		if err := st.Untake("chain", "t13"); err != nil {
			t.Fatal(err)
		}
	}
	if e, ok := st.Lookup("chain"); !ok || e != t1Mark {
		t.Fatalf("after both Untakes: %+v %v, want t1's mark %+v", e, ok, t1Mark)
	}

	// A renewal by the first claim while a retried take is in flight:
	// the retry's Untake puts back the first claim's lease, renewed.
	if _, _, _, err := st.Take("renewed", "t7", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := st.Take("renewed", "t7", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Renew("renewed", "t7", time.Hour); err != nil || !ok {
		t.Fatalf("t7's renewal: %v %v", ok, err)
	}
	renewed, _ := st.Lookup("renewed")
	if err := st.Untake("renewed", "t7"); err != nil {
		t.Fatal(err)
	}
	if e, ok := st.Lookup("renewed"); !ok || e != renewed {
		t.Fatalf("after a renewal and the retry's Untake: %+v %v, want t7's renewed lease %+v", e, ok, renewed)
	}
}
