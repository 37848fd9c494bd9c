package reliability

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
)

// readmeRecipe returns the README's backend recipe (the SQL block marked
// <!-- test: backend-recipe -->) as its statements, comments left out,
// and the text around it (the paragraph before, the block's comments).
func readmeRecipe(t *testing.T) (stmts []string, prose string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n\n([^\n]*(?:\n[^\n]+)*?)\n<!-- test: backend-recipe -->\n```sql\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md has no sql block marked <!-- test: backend-recipe --> after a paragraph")
	}
	prose = string(m[1])
	for _, line := range strings.Split(string(m[2]), "\n") {
		code, comment, _ := strings.Cut(line, "--")
		prose += "\n" + comment
		for _, s := range strings.Split(code, ";") {
			if s = strings.TrimSpace(s); s != "" {
				stmts = append(stmts, s)
			}
		}
	}
	return stmts, prose
}

// TestBackendRecipe runs the README's backend recipe (the production
// note that closes the crash window in the backend) as written, on a
// real PostgreSQL, as an HTTP backend: each delivery runs the block's
// statements on one connection, $1 the event ID, the work (a row in a
// payments table without a unique key, so a double shows, and some
// time) between the insert and COMMIT, whatever the client does; a
// delivery with the header whose insert added no row rolls back and
// answers 200 without the work, as the block's comment says. Checked:
//   - a marked retry that arrives while the first attempt's transaction
//     is still open (its client, Caddy, gone) waits for it and answers
//     200 without doing the work again;
//   - a marked retry after a first attempt whose work failed (rolled
//     back) does the work: nothing lost;
//   - a marked delivery of a new event does the work, and two at once
//     do it once;
//   - an unmarked delivery does the work (the recipe trusts the edge);
//   - behind a real Caddy on the PostgreSQL store, SIGKILLed while the
//     backend works on several events (600 ms each) and started again,
//     every event is processed once and the retries of those at the
//     backend at the kill reach it marked (this needs the handler to
//     mark them: it fails before issue 26's change).
func TestBackendRecipe(t *testing.T) {
	stmts, prose := readmeRecipe(t)
	if len(stmts) != 3 || stmts[0] != "BEGIN" || stmts[2] != "COMMIT" {
		t.Fatalf("the README's backend recipe is not BEGIN; <check>; COMMIT: %q", stmts)
	}
	check := stmts[1]
	ins := regexp.MustCompile(`^INSERT INTO (\w+) \((\w+)\) VALUES \(\$1\) ON CONFLICT DO NOTHING$`).FindStringSubmatch(check)
	if ins == nil {
		t.Fatalf("the README's backend recipe checks with %q, not INSERT INTO <table> (<column>) VALUES ($1) ON CONFLICT DO NOTHING", check)
	}
	for _, says := range []string{"`" + ledger.PriorAttemptHeader + ": unknown`", "PRIMARY KEY", "0 rows", "header present", "ROLLBACK", "answer 200", "the work"} {
		if !strings.Contains(prose, says) {
			t.Errorf("the README's backend recipe does not say %q:\n%s", says, prose)
		}
	}

	pg := pgtest.Start(t)
	ctx := context.Background()
	pg.Psql(t, "CREATE TABLE "+ins[1]+" ("+ins[2]+" text PRIMARY KEY)")
	pg.Psql(t, "CREATE TABLE payments (event_id text NOT NULL)")
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	const work = 600 * time.Millisecond
	var mu sync.Mutex
	committing := map[string]time.Time{} // when each event's unmarked delivery sent its COMMIT
	inserted := map[string]bool{}        // events whose unmarked delivery has done its insert
	fail := map[string]bool{"evt_failed": true}
	var reached, working, markedSeen atomic.Int64 // deliveries received; under way; marked
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		working.Add(1)
		defer working.Add(-1)
		id := r.Header.Get("Sangho-Event-ID")
		_, marked := r.Header[ledger.PriorAttemptHeader]
		if marked {
			markedSeen.Add(1)
		}
		// The work goes on whatever the client does: the database
		// calls do not use the request's context.
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Errorf("%s: %v", id, err)
			w.WriteHeader(500)
			return
		}
		defer conn.Release()
		exec := func(sql string, args ...any) int64 {
			tag, err := conn.Exec(ctx, sql, args...)
			if err != nil {
				t.Errorf("%s: %s: %v", id, sql, err)
			}
			return tag.RowsAffected()
		}
		exec(stmts[0])
		if exec(check, id) == 0 && marked {
			exec("ROLLBACK")
			w.WriteHeader(200) // done before
			return
		}
		exec("INSERT INTO payments (event_id) VALUES ($1)", id)
		if !marked {
			mu.Lock()
			inserted[id] = true
			mu.Unlock()
		}
		time.Sleep(work)
		mu.Lock()
		failed := fail[id]
		delete(fail, id)
		mu.Unlock()
		if failed {
			exec("ROLLBACK")
			w.WriteHeader(500)
			return
		}
		// Noted before COMMIT is sent: the server ends the transaction,
		// and a retry waiting on its row goes on, before COMMIT returns
		// here, so a time noted after it may come after the retry's
		// answer (or not yet be noted when the retry is checked).
		if !marked {
			mu.Lock()
			committing[id] = time.Now()
			mu.Unlock()
		}
		exec(stmts[2])
		w.WriteHeader(200)
	}))
	defer backend.Close()

	post := func(id string, marked bool, timeout time.Duration) <-chan ledger.Answer {
		return ledger.Post(backend.URL, id, marked, timeout)
	}
	const long = 30 * time.Second
	want200 := func(what string, a ledger.Answer) {
		t.Helper()
		if a.Err != nil || a.Status != 200 {
			t.Errorf("%s: %d %v, want 200", what, a.Status, a.Err)
		}
	}
	processed := func(id string) int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM payments WHERE event_id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The first attempt's client (Caddy) goes away mid-work; the marked
	// retry comes while the work's transaction is open.
	if a := <-post("evt_crash", false, 100*time.Millisecond); a.Err == nil {
		t.Fatalf("evt_crash: the first attempt answered %d before its work was done", a.Status)
	}
	// The retry is sent once the first attempt holds its row (its
	// transaction open, the work under way): the case checked.
	poll.Until(t, 10*time.Second, "evt_crash: the first attempt's insert", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inserted["evt_crash"]
	})
	retry := <-post("evt_crash", true, long)
	want200("evt_crash, marked retry during the first attempt's work", retry)
	mu.Lock()
	firstCommit := committing["evt_crash"]
	mu.Unlock()
	if firstCommit.IsZero() || retry.At.Before(firstCommit) {
		t.Errorf("evt_crash: the marked retry answered at %v, before the first attempt's work sent its COMMIT (%v): it did not wait for it", retry.At, firstCommit)
	}

	// The first attempt's work failed and rolled back: the marked retry
	// does it.
	if a := <-post("evt_failed", false, long); a.Status != 500 {
		t.Errorf("evt_failed, first attempt: %d %v, want 500", a.Status, a.Err)
	}
	want200("evt_failed, marked retry", <-post("evt_failed", true, long))

	// A marked delivery of a new event, and two at once.
	want200("evt_new, marked", <-post("evt_new", true, long))
	a, b := post("evt_twice", true, long), post("evt_twice", true, long)
	want200("evt_twice, marked (1)", <-a)
	want200("evt_twice, marked (2)", <-b)

	// Unmarked deliveries trust the edge: each does the work.
	want200("evt_plain, 1", <-post("evt_plain", false, long))
	want200("evt_plain, 2", <-post("evt_plain", false, long))

	for id, want := range map[string]int{"evt_crash": 1, "evt_failed": 1, "evt_new": 1, "evt_twice": 1, "evt_plain": 2} {
		if n := processed(id); n != want {
			t.Errorf("%s: the work done %d times, want %d", id, n, want)
		}
	}

	// Behind Caddy on the PostgreSQL store, killed mid-request: the
	// recipe as written processes every event once.
	t.Run("behind Caddy killed mid-request", func(t *testing.T) {
		p := startCaddy(t, siteConfigTimeout(pgStore(pg.Addr, ""), strings.TrimPrefix(backend.URL, "http://"), "", 30*time.Second))
		n := 12 * scale
		s := newSender([]string{p.url}, 1)
		s.client.Timeout = 30 * time.Second
		s.giveUp = 90 * time.Second
		s.pace = 100 * time.Millisecond
		markedBefore, base := markedSeen.Load(), reached.Load()
		var atKill int64
		ids, acked := s.run("recipe", n, func(*atomic.Int64) {
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
				if reached.Load()-base >= int64(n/2) && working.Load() > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("after 60 s, no instant to kill")
					return
				}
			}
			atKill = working.Load()
			s.fig.faults.Add(1)
			killNow(p)
			if !p.launch(t) {
				b, _ := os.ReadFile(p.log)
				t.Errorf("caddy exited before listening again:\n%s", b)
			}
		})
		for deadline := time.Now().Add(30 * time.Second); working.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		var twice, lost []string
		for _, id := range ids {
			n := processed(id)
			switch {
			case n == 1:
				s.fig.once++
			case n > 1:
				s.fig.twice++
				twice = append(twice, id)
			}
			if n == 0 || !acked[id] {
				s.fig.lost++
				lost = append(lost, id)
			}
		}
		marked := markedSeen.Load() - markedBefore
		fig := fmt.Sprintf("%s; deliveries at the backend at the kill %d, marked deliveries %d", s.fig, atKill, marked)
		t.Log(fig)
		fmt.Printf("FIGURES the README's backend recipe behind Caddy on PostgreSQL, SIGKILLed mid-request, work %v: %s\n", work, fig)
		if len(twice) > 0 || len(lost) > 0 {
			t.Errorf("processed twice %v, lost %v", head(twice), head(lost))
		}
		if atKill > 0 && marked == 0 {
			t.Errorf("%d deliveries at the backend at the kill, and no retry marked", atKill)
		}
	})
}
