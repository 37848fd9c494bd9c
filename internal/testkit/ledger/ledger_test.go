package ledger

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLedger: the ledger counts what reaches it and what it processed,
// answers as told, and comes back on the same address after Down.
func TestLedger(t *testing.T) {
	l := New(t)
	l.RecordBodies()
	l.Behave(func(id string, n int) Action {
		switch {
		case id == "evt_fail" && n == 1:
			return Action{Status: 500}
		case id == "evt_crash":
			return Action{Crash: true}
		}
		return Action{Status: 201}
	})
	post := func(id string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Addr+"/", strings.NewReader(`{"id":"`+id+`"}`))
		req.Header.Set("Sangho-Event-ID", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if st, body, err := post("evt_ok"); st != 201 || body != `{"app":"evt_ok"}` || err != nil {
		t.Fatalf("evt_ok: %d %q %v", st, body, err)
	}
	if st, _, _ := post("evt_fail"); st != 500 {
		t.Fatalf("evt_fail, first: %d", st)
	}
	if st, _, _ := post("evt_fail"); st != 201 {
		t.Fatalf("evt_fail, second: %d", st)
	}
	if _, _, err := post("evt_crash"); err == nil {
		t.Fatal("a crash answered")
	}
	for id, want := range map[string][2]int{"evt_ok": {1, 1}, "evt_fail": {2, 1}, "evt_crash": {1, 0}} {
		if r, d := l.Counts(id); r != want[0] || d != want[1] {
			t.Errorf("%s: received %d, done %d; want %v", id, r, d, want)
		}
	}
	if r, d := l.Totals(); r != 4 || d != 2 || l.Faults() != 2 || string(l.Body("evt_ok")) != `{"id":"evt_ok"}` {
		t.Errorf("totals %d %d, faults %d, body %q", r, d, l.Faults(), l.Body("evt_ok"))
	}

	addr := l.Addr
	l.Down()
	if _, _, err := post("evt_down"); err == nil {
		t.Fatal("answered while down")
	}
	l.Start(t)
	if l.Addr != addr {
		t.Fatalf("restarted on %s, not %s", l.Addr, addr)
	}
	l.Behave(func(string, int) Action { return Action{Delay: 10 * time.Millisecond} })
	if st, _, err := post("evt_up"); st != 200 || err != nil {
		t.Fatalf("after Start: %d %v", st, err)
	}
}

// TestLedgerFinishesWorkWhenClientGoesAway: a client that gives up
// mid-work does not stop the work: the delivery is processed when the
// work completes. With RollBack the work is abandoned instead. The
// Sangho-Dedup-Prior-Attempt header is recorded per delivery.
func TestLedgerFinishesWorkWhenClientGoesAway(t *testing.T) {
	l := New(t)
	const work = 300 * time.Millisecond
	l.Behave(func(id string, n int) Action {
		return Action{Delay: work, RollBack: id == "evt_rollback"}
	})
	giveUp := &http.Client{Timeout: 50 * time.Millisecond}
	post := func(id string, marked bool) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Addr+"/", strings.NewReader(`{}`))
		req.Header.Set("Sangho-Event-ID", id)
		if marked {
			req.Header.Set(PriorAttemptHeader, "unknown")
		}
		if resp, err := giveUp.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("%s: answered before the work was done", id)
		}
	}
	post("evt_finish", false)
	post("evt_finish", true)
	post("evt_rollback", false)
	if w := l.Working(); w == 0 {
		t.Error("Working() is 0 while the ledger works")
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Working() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r, d := l.Counts("evt_finish"); r != 2 || d != 2 {
		t.Errorf("evt_finish, client gone mid-work: received %d, processed %d; want 2 and 2 (the work completes)", r, d)
	}
	if r, d := l.Counts("evt_rollback"); r != 1 || d != 0 {
		t.Errorf("evt_rollback, client gone mid-work: received %d, processed %d; want 1 and 0 (rolled back)", r, d)
	}
	ds := l.Deliveries("evt_finish")
	if len(ds) != 2 || ds[0].Marked || !ds[1].Marked || ds[1].PriorAttempt != "unknown" || !ds[0].Done() || !ds[1].Done() {
		t.Fatalf("deliveries of evt_finish: %+v", ds)
	}
	if took := ds[0].Ended.Sub(ds[0].Began); took < work {
		t.Errorf("the work took %v, less than %v", took, work)
	}
	if ds := l.Deliveries("evt_rollback"); len(ds) != 1 || ds[0].Done() {
		t.Errorf("deliveries of evt_rollback: %+v", ds)
	}
}

// TestLedgerMarkerAware: with CheckIfMarked, a marked delivery of an
// event the ledger processed answers 2xx without the work, also when it
// arrives while the earlier delivery still works (it waits for that
// work's outcome, as an INSERT waits on the row lock of an uncommitted
// one); a marked delivery of an event not processed (never, failed,
// rolled back) does the work; an unmarked one does the work directly.
// The plain ledger, for contrast, does a marked delivery's work again.
func TestLedgerMarkerAware(t *testing.T) {
	l := New(t)
	const work = 300 * time.Millisecond
	l.Behave(func(id string, n int) Action {
		a := Action{Delay: work, CheckIfMarked: id != "evt_plain"}
		switch {
		case id == "evt_failed" && n == 1:
			a.Status = 500
		case id == "evt_rollback" && n == 1:
			a.RollBack = true
		}
		return a
	})
	post := func(id string, marked bool, timeout time.Duration) <-chan Answer {
		return Post("http://"+l.Addr+"/", id, marked, timeout)
	}
	// Wait until the ledger works on the first delivery of id.
	working := func(id string) {
		for deadline := time.Now().Add(5 * time.Second); ; {
			if r, _ := l.Counts(id); r > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never reached the ledger", id)
			}
			time.Sleep(time.Millisecond)
		}
	}
	const long = 10 * time.Second

	// The first attempt's client is gone (Caddy died); the work goes on,
	// and the marked retry arrives while it does.
	first := post("evt_beside", false, 50*time.Millisecond)
	working("evt_beside")
	if a := <-first; a.Err == nil {
		t.Fatalf("evt_beside: the first delivery answered %d before its work was done", a.Status)
	}
	retry := <-post("evt_beside", true, long)
	// A marked retry after the work was done, and a later unmarked one
	// (the ledger trusts the edge: done again).
	later := <-post("evt_beside", true, long)
	unmarked := <-post("evt_beside", false, long)
	for name, a := range map[string]Answer{"marked retry beside the work": retry, "marked retry after": later, "unmarked": unmarked} {
		if a.Err != nil || a.Status != 200 {
			t.Errorf("evt_beside, %s: %d %v, want 200", name, a.Status, a.Err)
		}
	}
	ds := l.Deliveries("evt_beside")
	if len(ds) != 4 || !ds[0].Done() || !ds[1].DoneBefore || ds[1].Done() || !ds[2].DoneBefore || ds[2].Done() || ds[3].DoneBefore || !ds[3].Done() {
		t.Fatalf("deliveries of evt_beside: %+v; want processed, done before (marked), done before (marked), processed (unmarked)", ds)
	}
	if ds[1].Began.After(ds[0].Ended) || ds[1].Left.Before(ds[0].Ended) {
		t.Errorf("the marked retry did not wait for the work under way: it came at %v, left at %v, the work ended at %v", ds[1].Began, ds[1].Left, ds[0].Ended)
	}
	if _, d := l.Counts("evt_beside"); d != 2 {
		t.Errorf("evt_beside processed %d times, want 2 (the first, and the unmarked delivery)", d)
	}

	// A marked delivery of an event never processed, or whose first
	// attempt failed or was rolled back (its client gone), does the work.
	if a := <-post("evt_new", true, long); a.Status != 200 {
		t.Errorf("evt_new, marked: %d %v", a.Status, a.Err)
	}
	if a := <-post("evt_failed", false, long); a.Status != 500 {
		t.Errorf("evt_failed, first: %d %v", a.Status, a.Err)
	}
	if a := <-post("evt_failed", true, long); a.Status != 200 {
		t.Errorf("evt_failed, marked retry: %d %v", a.Status, a.Err)
	}
	gone := post("evt_rollback", false, 50*time.Millisecond)
	working("evt_rollback")
	if a := <-gone; a.Err == nil {
		t.Fatalf("evt_rollback: answered %d before its work was done", a.Status)
	}
	if a := <-post("evt_rollback", true, long); a.Status != 200 {
		t.Errorf("evt_rollback, marked retry: %d %v", a.Status, a.Err)
	}
	for _, id := range []string{"evt_new", "evt_failed", "evt_rollback"} {
		ds := l.Deliveries(id)
		if last := ds[len(ds)-1]; !last.Done() || last.DoneBefore {
			t.Errorf("%s: the marked delivery was not processed: %+v", id, ds)
		}
		if _, d := l.Counts(id); d != 1 {
			t.Errorf("%s processed %d times, want 1", id, d)
		}
	}

	// The plain ledger does the work of a marked delivery again.
	<-post("evt_plain", false, long)
	<-post("evt_plain", true, long)
	if _, d := l.Counts("evt_plain"); d != 2 {
		t.Errorf("evt_plain, plain backend: processed %d times, want 2", d)
	}
	if l.Working() != 0 || len(l.WorkingOn()) != 0 {
		t.Errorf("still working: %d, %v", l.Working(), l.WorkingOn())
	}
}
