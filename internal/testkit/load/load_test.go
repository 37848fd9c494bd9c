package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBodySize(t *testing.T) {
	for _, size := range []int{200, 1024, 64 << 10} {
		b := Body("evt_1", "x.y", size)
		if len(b) < size-16 || len(b) > size+16 {
			t.Errorf("Body(%d) is %d bytes", size, len(b))
		}
		var v struct{ ID, Type string }
		if err := json.Unmarshal(b, &v); err != nil || v.ID != "evt_1" || v.Type != "x.y" {
			t.Errorf("Body(%d) = %v %+v", size, err, v)
		}
	}
}

// TestRunCountsAndDuplicates runs load against a server that answers
// like sangho_dedup (duplicates marked) and checks the report's counts.
func TestRunCountsAndDuplicates(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	heads := map[byte]bool{} // the first hex digit of each ID
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Sangho-Event-ID")
		if r.Header.Get("Sangho-Signature") == "" {
			w.WriteHeader(401)
			return
		}
		mu.Lock()
		dup := seen[id]
		seen[id] = true
		if len(id) > len("evt_") {
			heads[id[len("evt_")]] = true
		}
		mu.Unlock()
		if dup {
			w.Header().Set("Sangho-Dedup", "duplicate")
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 4, Events: 400, Duplicates: 0.5, BodySize: 300, Warmup: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 400 || res.ByStatus["200"] != 400 {
		t.Fatalf("requests %d, statuses %v", res.Requests, res.ByStatus)
	}
	if res.NewSent+res.DupSent != 400 || res.DupSent < 120 || res.DupSent > 280 {
		t.Fatalf("new %d, redeliveries %d: not about half", res.NewSent, res.DupSent)
	}
	if res.ByDedup["duplicate"] != res.DupSent {
		t.Fatalf("server saw %d duplicates, load sent %d", res.ByDedup["duplicate"], res.DupSent)
	}
	// The IDs are EventID's, spread over the key space as senders'
	// are: not numbered in order behind one prefix.
	if len(heads) < 12 {
		t.Fatalf("the %d IDs sent begin with %d different hex digits after evt_; want them spread (EventID)", len(seen), len(heads))
	}
	if !(res.P50 <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.Max) {
		t.Fatalf("quantiles out of order: %+v", res)
	}
}

func TestRunAtARate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 4, Duration: time.Second, Rate: 100, BodySize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 80 || res.Requests > 110 {
		t.Fatalf("%d requests in 1 s at 100/s", res.Requests)
	}
}

// countingBody reports how much of it was read.
type countingBody struct {
	r io.Reader
	n int
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	return n, err
}

// TestSinkReadsTheBodyAndAnswers: the sink reads each body to the end (a
// backend that did not would let a proxy see a broken upload) and answers
// 200 {"received":true} as JSON.
func TestSinkReadsTheBodyAndAnswers(t *testing.T) {
	body := &countingBody{r: strings.NewReader(strings.Repeat("x", 100_000))}
	req := httptest.NewRequest(http.MethodPost, "/", body)
	rec := httptest.NewRecorder()
	SinkHandler.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Body.String() != `{"received":true}` || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("answer %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
	if body.n != 100_000 {
		t.Fatalf("read %d of 100000 body bytes", body.n)
	}
}

// NestedBodySize is the push of NestedBody, as many of its commits as
// fit, with the last commit's message filled out to exactly the size:
// valid JSON, the ID at the top level, many small nested objects.
func TestNestedBodySize(t *testing.T) {
	for _, size := range []int{1024, 64 << 10, 69854} {
		for _, id := range []string{"evt_nested", "evt_dnctbehzyw2j_n0123456"} {
			b := NestedBodySize(id, size)
			if len(b) != size {
				t.Errorf("NestedBodySize(%q, %d) is %d bytes", id, size, len(b))
			}
			var v struct {
				ID   string
				Data struct {
					Object struct{ Commits []map[string]any }
				}
			}
			if err := json.Unmarshal([]byte(b), &v); err != nil || v.ID != id {
				t.Fatalf("NestedBodySize(%q, %d): %v, id %q", id, size, err, v.ID)
			}
			n := len(v.Data.Object.Commits)
			if size >= 64<<10 && n < 150 {
				t.Errorf("NestedBodySize(%q, %d) has %d commits", id, size, n)
			}
			// the same commits as NestedBody's but for the last one's
			// longer message
			same := NestedBody(id, n)
			cut := strings.LastIndex(same, `","timestamp"`)
			if !strings.HasPrefix(b, same[:cut]) || !strings.HasSuffix(b, same[cut:]) {
				t.Errorf("NestedBodySize(%q, %d) is not NestedBody(%q, %d) with a longer last message", id, size, id, n)
			}
		}
	}
	if b := NestedBody("evt_nested", 185); len(b) != 69854 {
		t.Errorf("the root benchmarks' push is %d bytes, its comments say 69,854", len(b))
	}
}

// With Nested, Run sends NestedBodySize's push, exactly BodySize bytes,
// its top-level "id" the event's header.
func TestRunNestedBodies(t *testing.T) {
	var mu sync.Mutex
	var bad []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var v struct {
			ID   string
			Data struct {
				Object struct{ Commits []any }
			}
		}
		err := json.Unmarshal(body, &v)
		mu.Lock()
		defer mu.Unlock()
		if id := r.Header.Get("Sangho-Event-ID"); err != nil || len(body) != 64<<10 || v.ID != id || len(v.Data.Object.Commits) < 150 {
			bad = append(bad, id)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 2, Events: 20, BodySize: 64 << 10, Nested: true})
	if err != nil || res.Requests != 20 {
		t.Fatalf("%+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d of 20 bodies not a nested push of 64 KiB with the event's ID, first %s", len(bad), bad[0])
	}
}

// At a rate, a request held behind a slow answer counts from its due
// time, not from when a connection was free to send it: one answer
// held 300 ms on the only connection at 100 requests a second delays
// the ~30 due behind it, and they count the wait (a generator that
// timed each request from its send would see one slow request in 100,
// and a p90 under a millisecond).
func TestRunAtARateCountsRequestsHeldBehindASlowOne(t *testing.T) {
	var first atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(false, true) {
			time.Sleep(300 * time.Millisecond)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 1, Duration: time.Second, Rate: 100, BodySize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 80 || res.Requests > 110 {
		t.Fatalf("%d requests in 1 s at 100/s: the held ones must still be sent", res.Requests)
	}
	if res.P90 < 50 || res.Max < 290 {
		t.Fatalf("p90 %.2f ms, max %.2f ms: the ~30 requests due during a 300 ms answer must count their wait (want p90 ≥ 50 ms, max ≥ 290 ms)", res.P90, res.Max)
	}
}

// Paced work counts from when its generator woke, with at most
// TimerSlack of that lateness left out.
func TestPacedStart(t *testing.T) {
	due := time.Unix(1000, 0)
	for _, c := range []struct {
		name       string
		woke, want time.Time
	}{
		{"woken on time", due, due},
		{"woken late by the timer", due.Add(900 * time.Microsecond), due.Add(900 * time.Microsecond)},
		{"woken later than the timer's granularity", due.Add(5 * time.Millisecond), due.Add(TimerSlack)},
	} {
		if got := PacedStart(due, c.woke); !got.Equal(c.want) {
			t.Errorf("%s: starts at due%+v, want due%+v", c.name, got.Sub(due), c.want.Sub(due))
		}
	}
}

// At a rate, the end of the run hides nothing: the requests due before
// it, held behind a slow answer near it, are still sent and counted
// with their wait (a generator that stopped at the deadline would drop
// them, and the stall with them).
func TestRunAtARateCountsTheStallAtTheEnd(t *testing.T) {
	start := time.Now()
	var held atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) > 700*time.Millisecond && held.CompareAndSwap(false, true) {
			time.Sleep(400 * time.Millisecond)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 1, Duration: time.Second, Rate: 100, BodySize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 95 || res.ByStatus["200"] != res.Requests {
		t.Fatalf("%d requests (%v) at 100/s for 1 s: every one due before the end must be sent and answered", res.Requests, res.ByStatus)
	}
	// the ~30 due from 0.7 s on wait 100–400 ms: over a quarter
	if res.P90 < 90 || res.Max < 390 || res.LatencyFrom != "due" {
		t.Fatalf("p90 %.2f ms, max %.2f ms, from %q: the requests due during the 400 ms answer near the end must count their wait", res.P90, res.Max, res.LatencyFrom)
	}
}

// At a rate, a token that cannot be sent within Timeout of the run's
// end counts as unsent, with its wait: the run ends, and what the
// server could not take is not hidden. 7 answers a second against 100
// due: from 0.5 s on, a backlog that ends with the run's Timeout.
func TestRunAtARateCountsUnsentRequests(t *testing.T) {
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) > 500*time.Millisecond {
			time.Sleep(150 * time.Millisecond) // 7 a second on one connection
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 1, Duration: time.Second, Rate: 100, BodySize: 200, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Unsent < 10 || res.Requests+res.Unsent < 95 || res.Requests != sum(res.ByStatus) {
		t.Fatalf("%d requests (%v), %d unsent: the tokens left when the run and its Timeout ended must count as unsent, and only as that", res.Requests, res.ByStatus, res.Unsent)
	}
	if res.Seconds > 2.5 {
		t.Fatalf("the run took %.1f s; want it ended within Timeout (and one request's) of its 1 s", res.Seconds)
	}
	// a token due at 0.6 s, unsent at 1.3 s, waited 0.7 s
	if res.Max < 650 {
		t.Fatalf("max %.2f ms: the unsent tokens waited since their due time", res.Max)
	}
}

// sum adds the counts of m.
func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Without a rate the run ends at its Duration: no request starts after
// it, and one in flight then is not counted (neither as an error), but
// let finish, not cut: a delivery its client cuts after the claim is
// held by sangho_dedup until lock_ttl ("event held"), and sangho-send
// load left a few such events at every run's end.
func TestRunClosedLoopEndsAtItsDuration(t *testing.T) {
	start := time.Now()
	var cut, finished atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) > 200*time.Millisecond {
			select {
			case <-time.After(time.Second):
				finished.Add(1)
			case <-r.Context().Done():
				cut.Add(1)
			}
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 4, Duration: 400 * time.Millisecond, BodySize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Seconds > 0.41 || res.ByStatus["error"] != 0 || res.Unsent != 0 || res.LatencyFrom != "send" || res.Requests == 0 {
		t.Fatalf("%.2f s, %d requests (%v), %d unsent, from %q: want the run ended at 0.4 s, the requests in flight then not counted, latency from the send",
			res.Seconds, res.Requests, res.ByStatus, res.Unsent, res.LatencyFrom)
	}
	if cut.Load() != 0 || finished.Load() != 4 {
		t.Fatalf("requests in flight at the end: %d cut, %d finished; want the 4 finished", cut.Load(), finished.Load())
	}
}

// At a rate, the tokens the pacer still held when the run's Timeout
// ended (the server too far behind for its buffer) count as unsent
// too, each with its wait.
func TestRunAtARateCountsTheTokensNeverHandedOut(t *testing.T) {
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) > 100*time.Millisecond {
			time.Sleep(100 * time.Millisecond)
		}
	}))
	defer srv.Close()
	const rate = 3000 // 3,000 due, some 10 answered a second after 0.1 s
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 1, Duration: time.Second, Rate: rate, BodySize: 200, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if n := res.Requests + res.Unsent; n < rate-50 || n > rate || res.Unsent < 1500 {
		t.Fatalf("%d requests and %d unsent at %d/s for 1 s: every token due must be sent or counted, most of them unsent here", res.Requests, res.Unsent, rate)
	}
	if res.Max < 900 { // the first unsent, due at 0.1 s, counted at 1.2 s
		t.Fatalf("max %.2f ms: the tokens never handed out waited since their due time", res.Max)
	}
}

// TestEventIDsSpread: a run's event IDs are unique, of one length,
// and spread over the key space as senders' IDs are (their first hex
// digit takes every value), not ordered by their number, which would
// put a run's events in one narrow range of a store's keys.
func TestEventIDsSpread(t *testing.T) {
	const n = 4096
	seen := map[string]bool{}
	heads := map[byte]int{}
	ordered := 0
	prev := ""
	for _, kind := range []string{"w", "n"} {
		for i := range n {
			id := EventID("run1", kind, 4, i)
			if seen[id] {
				t.Fatalf("%s sent twice", id)
			}
			seen[id] = true
			if len(id) != len(EventID("run1", "n", 4, 0)) {
				t.Fatalf("%s: not the run's length", id)
			}
			if !strings.HasSuffix(id, fmt.Sprintf("_run1_%s%04d", kind, i)) {
				t.Fatalf("%s: the run, the kind and the number are not at its end", id)
			}
			heads[id[len("evt_")]]++
			if id > prev {
				ordered++
			}
			prev = id
		}
	}
	if len(heads) != 16 {
		t.Fatalf("first hex digits of %d IDs: %v; want all 16", 2*n, heads)
	}
	if ordered > 2*n*3/4 {
		t.Fatalf("%d of %d IDs sort after the one before: ordered, not spread", ordered, 2*n)
	}
	// The next run (the next round on the same store) does not put its
	// i-th event beside this run's i-th: the heads differ.
	const head = len("evt_") + 16
	for i := range n {
		a, b := EventID("run1", "n", 0, i), EventID("run2", "n", 0, i)
		if a[:head] == b[:head] {
			t.Fatalf("event %d of two runs: %s and %s begin alike", i, a, b)
		}
	}
}
