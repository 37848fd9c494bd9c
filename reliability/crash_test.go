package reliability

import (
	"fmt"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
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
