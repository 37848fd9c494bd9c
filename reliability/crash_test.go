package reliability

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
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

// atTheKills sorts the events of ids by where their processings stood at
// the kills: working, the backend was working on it when Caddy died (its
// work began before the process exited and completed after the signal);
// answered, its work completed before a signal while Sangho had not yet
// been answered (Caddy answers after the done record is written: it may
// have died before writing it, however long the commit took on a loaded
// disk). Only these events can be processed twice by a kill: the backend
// did work that no store recorded.
//
// A request that Caddy wrote to the backend's socket just before it
// died is still delivered by the kernel, and the backend's handler may
// begin it after the process is gone (a loaded machine, -race): a work
// that begins within killDeliverySlack after a kill counts as working
// at it. (Seen once in CI: a by-nature double, marked, reported as
// stray.) A double of an event first sent through the surviving
// instance in that window would need a mark to pass checkMarks, and
// only a killed instance's lease leaves one.
func atTheKills(l *ledger.Ledger, s *sender, ids []string, kills []killSpan) (working, answered map[string]bool) {
	working, answered = map[string]bool{}, map[string]bool{}
	for _, id := range ids {
		acked := s.ackedAt(id)
		for _, d := range l.Deliveries(id) {
			if !d.Done() {
				continue
			}
			for _, k := range kills {
				switch {
				case !d.Began.After(k.to.Add(killDeliverySlack)) && !d.Ended.Before(k.from):
					working[id] = true
				case d.Ended.Before(k.from) && (acked.IsZero() || acked.After(k.from)):
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

// killDeliverySlack: see atTheKills.
const killDeliverySlack = time.Second

// checkDoublesAtTheKills fails the test for every event processed twice
// that was not at the backend at a kill (atTheKills): something else
// doubled it. It returns the note for the figures line, and how many
// events were at the backend at a kill.
func checkDoublesAtTheKills(t *testing.T, l *ledger.Ledger, s *sender, ids []string, kills []killSpan) (string, int) {
	t.Helper()
	working, answered := atTheKills(l, s, ids, kills)
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
		t.Errorf("%d events processed twice that were not at the backend at a kill (neither in its work nor answered and not yet acknowledged to Sangho): not the crash window, e.g. %v",
			len(stray), head(stray))
	}
	return fmt.Sprintf("at the kill: backend working on %d (processed twice %d), answered but not acknowledged %d (processed twice %d)",
		len(working), twiceWorking, len(answered), twiceAnswered), len(working) + len(answered)
}

// checkMarks checks, for the deliveries of ids, what the mark
// (ledger.PriorAttemptHeader) promises (name says where, in its
// errors), and returns the note for the figures line:
//   - no unmarked delivery reached the backend while another delivery of
//     its event was there: a retry that comes while the earlier
//     attempt's lease lives gets 409, and one that takes over the lease
//     once its time ran out is marked;
//   - on the plain backend, an event's processings beyond its first are
//     all of marked deliveries (a double is always marked, so that a
//     backend that checks its own records when marked has none).
func checkMarks(t *testing.T, name string, l *ledger.Ledger, ids []string) string {
	t.Helper()
	var beside, unmarkedTwice []string
	var marked, markedDone, doneBefore int
	for _, id := range ids {
		ds := l.Deliveries(id)
		unmarkedDone := 0
		for j, d := range ds {
			if d.Marked {
				marked++
				if d.Done() {
					markedDone++
				}
				if d.DoneBefore {
					doneBefore++
				}
				continue
			}
			if d.Done() {
				unmarkedDone++
			}
			for _, e := range ds[:j] {
				if !d.Began.Before(e.Began) && (e.Left.IsZero() || d.Began.Before(e.Left)) {
					beside = append(beside, id)
					break
				}
			}
		}
		if unmarkedDone > 1 {
			unmarkedTwice = append(unmarkedTwice, id)
		}
	}
	if len(beside) > 0 {
		t.Errorf("%s: %d events had an unmarked delivery reach the backend while another delivery of the event was there (a retry run beside an attempt whose fate was unknown, neither refused with 409 nor marked), e.g. %v", name, len(beside), head(beside))
	}
	if len(unmarkedTwice) > 0 {
		t.Errorf("%s: %d events processed twice by unmarked deliveries (a double the backend could not tell), e.g. %v", name, len(unmarkedTwice), head(unmarkedTwice))
	}
	return fmt.Sprintf("marked deliveries %d (processed %d, answered as done before %d); unmarked retries beside another delivery %d, events processed twice unmarked %d",
		marked, markedDone, doneBefore, len(beside), len(unmarkedTwice))
}

// TestCaddyKilledMidRequestEveryStore plays the crash window on every
// durable store: Caddy is SIGKILLed while the backend works on events
// (20 ms, 1 s and 4 s of work each), started again, and Sangho's retries
// go on. The backend, like most, finishes its work when Caddy goes away:
// the work is done, and no store recorded it. Two backends side by side,
// on the same Caddy through the same kills: the plain one does every
// delivery's work; the marker-aware one checks its own records for the
// event ID atomically with its work when the delivery carries
// Sangho-Dedup-Prior-Attempt (ledger.Action.CheckIfMarked). Asserted,
// for both: nothing is lost; every double was at the backend at the
// kill; no unmarked retry runs beside the attempt the backend may still
// be working on (the lease outlives Caddy: 409 with Retry-After until it
// expires, marked after); for the plain backend, every double is of a
// marked delivery; for the marker-aware one, none is processed twice.
func TestCaddyKilledMidRequestEveryStore(t *testing.T) {
	works := []struct {
		work, pace time.Duration
		n          int
	}{
		// Events are sent one per pace to each backend, so that a few
		// are at the backend at any instant; Caddy is killed once half
		// reached it.
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
	backends := []struct {
		name, tag string // tag: in the event IDs, picks the backend
		aware     bool
	}{
		{"plain", "_plain_", false},
		{"marker-aware", "_aware_", true},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store has its own Caddy and ledger
			l := ledger.New(t)
			var work atomic.Int64
			l.Behave(func(id string, _ int) ledger.Action {
				return ledger.Action{Delay: time.Duration(work.Load()), CheckIfMarked: strings.Contains(id, backends[1].tag)}
			})
			// reverse_proxy and Sangho wait longer than any work: only
			// the kill cuts a request.
			p := startCaddy(t, siteConfigTimeout(st.store(t), l.Addr, "", 30*time.Second))
			for _, w := range works {
				work.Store(int64(w.work))
				n := w.n * scale
				base, _ := l.Totals()
				senders := make([]*sender, len(backends))
				var kills []killSpan
				relaunched := true
				// Kill once half the events reached the backend, at an
				// instant it is working on events of both backends (on
				// either after 20 s without such an instant).
				kill := func(*atomic.Int64) {
					start := time.Now()
					for {
						received, _ := l.Totals()
						if received-base >= n && l.Working() > 0 {
							on := strings.Join(l.WorkingOn(), " ")
							if time.Since(start) > 20*time.Second || (strings.Contains(on, backends[0].tag) && strings.Contains(on, backends[1].tag)) {
								break
							}
						}
						if time.Since(start) > 60*time.Second {
							t.Errorf("%v: after 60 s, %d of %d events at the backend, %d in its work: no instant to kill", w.work, received-base, 2*n, l.Working())
							return
						}
						time.Sleep(time.Millisecond)
					}
					senders[0].fig.faults.Add(1)
					kills = append(kills, killNow(p))
					if !p.launch(t) {
						b, _ := os.ReadFile(p.log)
						t.Errorf("caddy exited before listening again:\n%s", b)
						relaunched = false
					}
				}
				ids := make([][]string, len(backends))
				acked := make([]map[string]bool, len(backends))
				var wg sync.WaitGroup
				for i, b := range backends {
					s := newSender([]string{p.url}, 1)
					s.client.Timeout = 30 * time.Second
					s.giveUp = 90 * time.Second
					s.pace = w.pace
					senders[i] = s
					during := kill // the kill, once, from the first sender's run
					if i > 0 {
						during = nil
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						ids[i], acked[i] = s.run(fmt.Sprintf("kill%s%v", b.tag, w.work), n, during)
					}()
				}
				wg.Wait()
				waitIdle(l)
				atKill := 0
				for i, b := range backends {
					note, at := checkDoublesAtTheKills(t, l, senders[i], ids[i], kills)
					atKill += at
					name := fmt.Sprintf("%v, %s backend", w.work, b.name)
					senders[i].fig.note = note + "; " + checkMarks(t, name, l, ids[i])
					if c := senders[i].fig.noRetryAfter.Load(); c > 0 {
						t.Errorf("%s: %d answers 409 without Retry-After", name, c)
					}
					check(t, fmt.Sprintf("Caddy SIGKILLed mid-request, %s store, %s backend, work %v (finished when Caddy dies)", st.name, b.name, w.work),
						senders[i], l, ids[i], acked[i], !b.aware)
				}
				if len(kills) == 1 && atKill == 0 {
					t.Errorf("%v: the kill hit no event at the backend", w.work)
				}
				if !relaunched {
					return
				}
			}
		})
	}
}
