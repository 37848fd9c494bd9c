package donecache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
)

// liveCache is a cache of max entries on a clock the test moves, its
// connection up.
func liveCache(max int, now *int64) *Cache {
	c := New(max)
	c.now = func() int64 { return *now }
	c.up()
	return c
}

// TestExpiryAndBound: entries expire with their time to live, at most
// max are kept, a recently used one is kept over an unused one (CLOCK),
// and nothing is served while the connection is not live or has been
// silent for longer than Staleness.
func TestExpiryAndBound(t *testing.T) {
	var now int64 = 1000
	c := liveCache(3, &now)
	c.Put("a", "done:a", now+100, c.Generation())
	c.Put("b", "done:b", 0, c.Generation())
	c.Put("c", "done:c", 0, c.Generation())
	if v, ok := c.Get("a"); !ok || v != "done:a" {
		t.Fatalf("get a = %q %v", v, ok)
	}
	c.Put("d", "done:d", 0, c.Generation())
	if c.Len() != 3 || !c.Has("a") || !c.Has("d") {
		t.Fatalf("after a fourth entry: len %d, a %v, d %v; want 3, the used a kept", c.Len(), c.Has("a"), c.Has("d"))
	}
	now += 100
	c.Heard()
	if _, ok := c.Get("a"); ok || c.Has("a") {
		t.Fatal("an expired entry was served or kept")
	}
	if _, ok := c.Get("d"); !ok {
		t.Fatal("an entry without expiry was not served")
	}
	now += c.staleness + 1
	if _, ok := c.Get("d"); ok {
		t.Fatal("served while the connection had not answered for longer than staleness")
	}
	c.Heard()
	c.live.Store(false)
	if _, ok := c.Get("d"); ok {
		t.Fatal("served while the connection was not live")
	}
	c.live.Store(true)
	for i := range 100 {
		c.Put("k"+strconv.Itoa(i), "done:", 0, c.Generation())
	}
	if c.Len() != 3 {
		t.Fatalf("len %d after 100 puts, want at most 3", c.Len())
	}
}

// TestEvictsTheUnusedHotKeyKept: a key answered again and again stays
// cached while a stream of other keys passes through a full cache (the
// PostgreSQL store dropped an arbitrary entry before, the hot one as
// likely as any).
func TestEvictsTheUnusedHotKeyKept(t *testing.T) {
	var now int64 = 1
	c := liveCache(4, &now)
	c.Put("hot", "done:hot", 0, c.Generation())
	for i := range 1000 {
		if _, ok := c.Get("hot"); !ok {
			t.Fatalf("the hot key evicted after %d other keys", i)
		}
		c.Put("k"+strconv.Itoa(i), "done:", 0, c.Generation())
	}
}

// TestGetRacingPut: a record learned again (Put of a cached key) while
// a claim reads it: run with -race, which reported Get reading the
// entry's value and expiry while Put rewrote them.
func TestGetRacingPut(t *testing.T) {
	c := New(16)
	c.up()
	c.Put("k", "done:1", 0, c.Generation())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			c.Put("k", "done:"+strconv.Itoa(i), 0, c.Generation())
		}
	}()
	for range 2000 {
		if v, ok := c.Get("k"); !ok || !strings.HasPrefix(v, "done:") {
			t.Fatalf("get: %q %v", v, ok)
		}
	}
	wg.Wait()
}

// TestInvalidateRefusesEarlierLookUps: a look-up sent before an
// invalidation that may overtake its reply (a forget through this store,
// whose invalidation from Redis is still on the way; a PostgreSQL
// notification, which travels apart from the claims' reads) may carry
// the record the invalidation removed: its reply is not cached; a
// look-up sent after it is. The same for a flush, and for each change
// of the connection (down, and up again: a look-up sent while it was
// down may have read a record whose change it missed).
func TestInvalidateRefusesEarlierLookUps(t *testing.T) {
	for _, inv := range []struct {
		name string
		do   func(c *Cache)
	}{
		{"Invalidate", func(c *Cache) { c.Invalidate("k") }},
		{"Flush", func(c *Cache) { c.Flush() }},
		{"Down and up", func(c *Cache) { c.Down(); c.up() }},
	} {
		t.Run(inv.name, func(t *testing.T) {
			c := New(10)
			c.up()
			before := c.Generation()
			c.Put("k", "done:old", 0, before)
			inv.do(c)
			if _, ok := c.Get("k"); ok {
				t.Fatal("an invalidated record is still served")
			}
			c.Put("k", "done:old", 0, before)
			if c.Has("k") {
				t.Fatal("a look-up sent before the invalidation put its record back")
			}
			c.Put("k", "done:new", 0, c.Generation())
			if v, ok := c.Get("k"); !ok || v != "done:new" {
				t.Fatalf("a look-up sent after the invalidation: %q %v, want it cached", v, ok)
			}
		})
	}
}

// TestDropKeepsOtherLookUps: Drop (Redis's invalidation, which arrives
// after the replies to the look-ups sent before it) removes its key and
// refuses nothing else: a look-up of another key in flight is cached.
func TestDropKeepsOtherLookUps(t *testing.T) {
	c := New(10)
	c.up()
	c.Put("k", "done:k", 0, c.Generation())
	gen := c.Generation()
	c.Drop("k")
	if c.Has("k") {
		t.Fatal("a dropped key is still cached")
	}
	c.Put("other", "done:other", 0, gen)
	if !c.Has("other") {
		t.Fatal("a drop refused a look-up of another key")
	}
}

// TestNothingLearnedWhileDown: a look-up's reply is not cached while the
// connection is down, nor after it is up again if the look-up was sent
// while it was down (PostgreSQL: a claim that read a record before the
// new connection's LISTEN, whose forget notification it missed), and
// the cache is emptied when it goes down.
func TestNothingLearnedWhileDown(t *testing.T) {
	c := New(10)
	c.Put("k", "done:k", 0, c.Generation())
	if c.Has("k") {
		t.Fatal("learned before the connection was ever up")
	}
	c.up()
	c.Put("k", "done:k", 0, c.Generation())
	c.Down()
	if c.Has("k") || c.Live() {
		t.Fatal("the cache kept an entry, or stayed live, with its connection down")
	}
	gen := c.Generation()
	c.Put("k", "done:k", 0, gen)
	if c.Has("k") {
		t.Fatal("learned while the connection was down")
	}
	c.up()
	c.Put("k", "done:k", 0, gen)
	if c.Has("k") {
		t.Fatal("a look-up sent while the connection was down learned once it was up")
	}
}

// TestExpiresInSaturates: a record's remaining life longer than the
// clock can hold expires at the clock's end, never in the past; a life
// already over expires at once.
func TestExpiresInSaturates(t *testing.T) {
	if got := ExpiresIn(1000, math.MaxInt64); got != math.MaxInt64 {
		t.Fatalf("ExpiresIn(1000, max) = %d, want %d", got, int64(math.MaxInt64))
	}
	if got := ExpiresIn(1000, -time.Hour); got != 1000 {
		t.Fatalf("ExpiresIn(1000, -1h) = %d, want 1000", got)
	}
	if got := ExpiresIn(1000, time.Second); got != 1000+int64(time.Second) {
		t.Fatalf("ExpiresIn(1000, 1s) = %d", got)
	}
}

// TestKeeperReconnects: the Keeper runs session after session; a lost
// session empties the cache and stops serving it at once, the failure is
// reported once however often it repeats, On follows once the cache is
// served again, the gauge counts the cache off until the first Up and
// after each loss and not after Close, and Close ends a session in
// progress.
func TestKeeperReconnects(t *testing.T) {
	c := New(10)
	type event struct {
		kind string
		err  string
	}
	events := make(chan event, 100)
	var mu sync.Mutex
	var gauge []bool
	sessions := make(chan chan error) // each session waits for its end here
	k := Keep(c, func(ctx context.Context, k *Keeper) error {
		end := make(chan error, 1)
		select {
		case sessions <- end:
		case <-ctx.Done():
			return ctx.Err()
		}
		err := <-end
		if err != nil && err.Error() == "up" {
			k.Up()
			c.Put("k", "done:k", 0, c.Generation())
			select {
			case err = <-end:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return err
	}, Hooks{
		Off: func(err error) { events <- event{"off", err.Error()} },
		On:  func() { events <- event{"on", ""} },
		Gauge: func(off bool) {
			mu.Lock()
			gauge = append(gauge, off)
			mu.Unlock()
		},
		Wait: func(err error) time.Duration {
			if err.Error() == "refused" {
				return time.Millisecond
			}
			return 0
		},
	})
	next := func() chan error {
		t.Helper()
		select {
		case end := <-sessions:
			return end
		case <-time.After(5 * time.Second):
			t.Fatal("no new session within 5s")
			return nil
		}
	}
	want := func(kind, err string) {
		t.Helper()
		select {
		case e := <-events:
			if e.kind != kind || e.err != err {
				t.Fatalf("got %s %q, want %s %q", e.kind, e.err, kind, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s within 5s", kind)
		}
	}

	next() <- errors.New("refused") // never up
	want("off", "refused")
	next() <- errors.New("refused") // the same failure again: not reported
	end := next()
	end <- errors.New("up")
	waitFor(t, "the cache served", func() bool { return c.Live() && c.Has("k") })
	want("on", "")
	if k.Conns() != 1 {
		t.Fatalf("conns %d, want 1", k.Conns())
	}
	end <- errors.New("refused") // lost after it was up: reported again
	want("off", "refused")
	if c.Live() || c.Has("k") {
		t.Fatal("the cache still live, or not emptied, after its session ended")
	}
	end = next()
	end <- errors.New("up")
	want("on", "")
	k.Close() // ends the session in progress
	if c.Live() {
		t.Fatal("the cache live after Close")
	}
	select {
	case e := <-events:
		t.Fatalf("an event after the last: %+v", e)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(gauge); got != "[true false true false true false]" {
		t.Fatalf("gauge changes %s, want off, on, off, on, off at Close, and nothing counted once closed", got)
	}
}

// waitFor waits for cond, at most 5 s (poll.Until).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 5*time.Second, what, cond)
}
