package reliability

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// killSpan is one SIGKILL of Caddy: from just before the signal to the
// process's exit.
type killSpan struct{ from, to time.Time }

// killNow SIGKILLs p and returns the span of the kill.
func killNow(p *caddyProc) killSpan {
	k := killSpan{from: time.Now()}
	p.kill()
	k.to = time.Now()
	return k
}

// waitIdle waits (at most 30 s) until the ledger works on nothing: a
// first attempt cut off by a kill may still be at the backend after its
// retry was acknowledged (the lease expired before the work ended), and
// its work counts when it completes.
func waitIdle(l *ledger.Ledger) {
	for deadline := time.Now().Add(30 * time.Second); l.Working() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// answeredWithin is how long before a kill a backend's answer may have
// come without its done record being written yet: the commit after the
// answer (a Redis or PostgreSQL round trip, the file store's fsync: tens
// of milliseconds on a busy disk), with a wide margin for a loaded
// machine.
const answeredWithin = time.Second

// atTheKills sorts the events of ids by where their processings stood at
// the kills: working, the backend was working on it when Caddy died (its
// work began before the process exited and completed after the signal);
// answered, its work completed at most answeredWithin before a signal
// (Caddy may have died before the done record was written). Only these
// events can be processed twice by a kill: the backend did work that no
// store recorded.
func atTheKills(l *ledger.Ledger, ids []string, kills []killSpan) (working, answered map[string]bool) {
	working, answered = map[string]bool{}, map[string]bool{}
	for _, id := range ids {
		for _, d := range l.Deliveries(id) {
			if !d.Done() {
				continue
			}
			for _, k := range kills {
				switch {
				case !d.Began.After(k.to) && !d.Ended.Before(k.from):
					working[id] = true
				case d.Ended.Before(k.from) && k.from.Sub(d.Ended) <= answeredWithin:
					answered[id] = true
				}
			}
		}
	}
	for id := range working {
		delete(answered, id)
	}
	return working, answered
}

// checkDoublesAtTheKills fails the test for every event processed twice
// that was not at the backend at a kill (atTheKills): something else
// doubled it. It returns the note for the figures line, and how many
// events were at the backend at a kill.
func checkDoublesAtTheKills(t *testing.T, l *ledger.Ledger, ids []string, kills []killSpan) (string, int) {
	t.Helper()
	working, answered := atTheKills(l, ids, kills)
	var stray []string
	var twiceWorking, twiceAnswered int
	for _, id := range ids {
		if _, done := l.Counts(id); done > 1 {
			switch {
			case working[id]:
				twiceWorking++
			case answered[id]:
				twiceAnswered++
			default:
				stray = append(stray, id)
			}
		}
	}
	if len(stray) > 0 {
		t.Errorf("%d events processed twice that were not at the backend at a kill (neither in its work nor answered within %v before): not the crash window, e.g. %v",
			len(stray), answeredWithin, head(stray))
	}
	return fmt.Sprintf("at the kill: backend working on %d (processed twice %d), answered within %v before %d (processed twice %d)",
		len(working), twiceWorking, answeredWithin, len(answered), twiceAnswered), len(working) + len(answered)
}

// TestCaddyKilledMidRequestEveryStore measures the crash window on every
// durable store: Caddy is SIGKILLed while the backend works on events
// (20 ms, 1 s and 4 s of work each), started again, and Sangho's retries
// go on. The backend, like most, finishes its work when Caddy goes away:
// the work is done, and no store recorded it. On the file store the
// leases die with the process, so the retry after the restart is
// processed at once; on Redis and PostgreSQL the lease survives and the
// retry is processed once it expires (lock_ttl, 2 s here). Either way
// the events at the backend at the kill are processed twice: that is
// the window, measured and printed, not asserted. Asserted: nothing is
// lost, and every double was at the backend at the kill.
func TestCaddyKilledMidRequestEveryStore(t *testing.T) {
	works := []struct {
		work, pace time.Duration
		n          int
	}{
		// Events are sent one per pace, so that a few are at the backend
		// at any instant; Caddy is killed once half reached it.
		{20 * time.Millisecond, 10 * time.Millisecond, 40},
		{time.Second, 100 * time.Millisecond, 16},
		{4 * time.Second, 400 * time.Millisecond, 12},
	}
	stores := []struct {
		name  string
		store func(t *testing.T) string
	}{
		{"default (file)", func(*testing.T) string { return "" }},
		{"Redis", func(t *testing.T) string { return redisStore(redistest.Start(t).Addr) }},
		{"Redis Cluster", func(t *testing.T) string { return redisStore(redistest.StartCluster(t).Addrs()...) }},
		{"PostgreSQL", func(t *testing.T) string { return pgStore(pgtest.Start(t).Addr, "") }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store has its own Caddy and ledger
			l := ledger.New(t)
			var work atomic.Int64
			l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: time.Duration(work.Load())} })
			// reverse_proxy and Sangho wait longer than any work: only
			// the kill cuts a request.
			p := startCaddy(t, siteConfigTimeout(st.store(t), l.Addr, "", 30*time.Second))
			for _, w := range works {
				if t.Failed() {
					return
				}
				work.Store(int64(w.work))
				n := w.n * scale
				s := newSender([]string{p.url}, 1)
				s.client.Timeout = 30 * time.Second
				s.giveUp = 90 * time.Second
				s.pace = w.pace
				base, _ := l.Totals()
				var kills []killSpan
				ids, acked := s.run(fmt.Sprintf("kill_%v", w.work), n, func(*atomic.Int64) {
					// Kill once half the events reached the backend, at an
					// instant it is working on one.
					deadline := time.Now().Add(60 * time.Second)
					for {
						received, _ := l.Totals()
						if received-base >= n/2 && l.Working() > 0 {
							break
						}
						if time.Now().After(deadline) {
							t.Errorf("%v: after 60 s, %d of %d events at the backend, %d in its work: no instant to kill", w.work, received-base, n, l.Working())
							return
						}
						time.Sleep(time.Millisecond)
					}
					s.fig.faults.Add(1)
					kills = append(kills, killNow(p))
					if !p.launch(t) {
						b, _ := os.ReadFile(p.log)
						t.Errorf("caddy exited before listening again:\n%s", b)
					}
				})
				waitIdle(l)
				note, atKill := checkDoublesAtTheKills(t, l, ids, kills)
				s.fig.note = note
				if len(kills) == 1 && atKill == 0 {
					t.Errorf("%v: the kill hit no event at the backend", w.work)
				}
				check(t, fmt.Sprintf("Caddy SIGKILLed mid-request, %s store, backend work %v (finished when Caddy dies)", st.name, w.work), s, l, ids, acked, true)
			}
		})
	}
}
