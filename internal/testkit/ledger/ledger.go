// Package ledger is the backend of the whole-server tests: an HTTP server
// on a loopback port that records every event ID it receives and every
// one it processes (answers 2xx for, having done the work), and answers
// as the test tells it to. The event ID is the Sangho-Event-ID header's
// ("" without one). The root package's server tests and the reliability
// suite share it.
//
// Like a real backend, the ledger finishes its work when the client goes
// away: a delivery whose work completes is processed, whatever the
// socket does (a payment handler commits its transaction all the same).
// Action.RollBack opts into the rarer backend that abandons its work
// when the request goes away.
//
// Action.CheckIfMarked makes it a marker-aware backend: a delivery that
// carries PriorAttemptHeader (the edge could not vouch that it is the
// first attempt) checks the ledger's own records for the event ID
// atomically with its work, as a backend that inserts the ID into its
// own table in the work's transaction (INSERT … ON CONFLICT DO NOTHING)
// does: every delivery of the event holds the event's lock while it
// works (the row lock), and a marked one that finds the event processed
// answers 2xx without doing it again. An unmarked delivery does the work
// directly, trusting the edge.
package ledger

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Action is how the ledger answers one delivery.
type Action struct {
	Status int           // the answer; 0 is 200
	Delay  time.Duration // work time; the work completes and counts even if the request goes away
	// RollBack makes Delay's work abandoned, not processed, if the
	// request goes away before it completes: a backend that rolls back
	// on disconnect. Most do not; use it only for a test about one.
	RollBack bool
	Hang     time.Duration // work time that goes on even if nobody waits (a fault)
	Crash    bool          // drop the connection without an answer, the work not done (a fault)
	// CheckIfMarked makes the ledger a marker-aware backend for this
	// delivery (see the package comment): it holds the event's lock for
	// its work, and, marked, answers Status without the work if the
	// event was processed. Give every delivery of an event the same.
	CheckIfMarked bool
}

// PriorAttemptHeader is the request header that marks a delivery whose
// earlier attempt's fate is unknown. The ledger only records, per
// delivery, whether it was present (Delivery.Marked).
const PriorAttemptHeader = "Sangho-Dedup-Prior-Attempt"

// Delivery is one delivery of an event as the ledger saw it.
type Delivery struct {
	Marked       bool      // the request carried PriorAttemptHeader
	PriorAttempt string    // its value ("" without one)
	Began        time.Time // when the request reached the ledger
	Ended        time.Time // when its work completed and was processed; zero if it was not
	// DoneBefore: a marker-aware backend (Action.CheckIfMarked) found
	// the event processed and answered without the work.
	DoneBefore bool
	Left       time.Time // when the ledger was through with it (answered, or the work abandoned)
}

// Done reports whether the delivery was processed.
func (d Delivery) Done() bool { return !d.Ended.IsZero() }

// Ledger is the backend. Its answers carry X-Backend: ledger and the
// body {"app":"<event ID>"}.
type Ledger struct {
	Addr string // host:port, kept across Down and Start

	mu       sync.Mutex
	behave   func(id string, n int) Action
	received map[string]int // deliveries that reached the backend
	done     map[string]int // deliveries it processed
	log      map[string][]Delivery
	inWork   map[string]int         // deliveries under way, by ID
	locks    map[string]*sync.Mutex // the events' locks (Action.CheckIfMarked)
	working  atomic.Int64           // deliveries whose work is under way
	bodies   map[string][]byte      // the last body of each ID, with RecordBodies
	srv      *http.Server
	faults   atomic.Int64 // crashes, hangs and non-2xx answers
}

// New starts a ledger on a free loopback port, stopped at cleanup.
func New(t testing.TB) *Ledger {
	t.Helper()
	l := &Ledger{Addr: "127.0.0.1:0", received: map[string]int{}, done: map[string]int{}, log: map[string][]Delivery{},
		inWork: map[string]int{}, locks: map[string]*sync.Mutex{}}
	l.Start(t)
	t.Cleanup(l.Stop)
	return l
}

// Behave sets how the ledger answers the n-th delivery (1-based) of id;
// nil answers 200 at once.
func (l *Ledger) Behave(f func(id string, n int) Action) {
	l.mu.Lock()
	l.behave = f
	l.mu.Unlock()
}

// Start listens (again, after Stop or Down) on the ledger's address.
func (l *Ledger) Start(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may linger for a moment after a stop
		if ln, err = net.Listen("tcp", l.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("ledger: listen: %v", err)
	}
	if a := ln.Addr().String(); a != l.Addr { // the first start, on port 0
		l.Addr = a
	}
	srv := &http.Server{Handler: http.HandlerFunc(l.serve), ReadHeaderTimeout: 10 * time.Second}
	l.mu.Lock()
	l.srv = srv
	l.mu.Unlock()
	go srv.Serve(ln)
}

// Stop closes the ledger and every connection at once.
func (l *Ledger) Stop() {
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	_ = srv.Close()
}

// Down stops accepting connections (new ones are refused) but lets the
// requests in flight finish: the backend is down, not crashing mid-work.
func (l *Ledger) Down() {
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

// Counts returns how many deliveries of id reached the ledger and how
// many it processed.
func (l *Ledger) Counts(id string) (received, done int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.received[id], l.done[id]
}

// Totals returns how many deliveries reached the ledger and how many it
// processed, all IDs together.
func (l *Ledger) Totals() (received, done int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.received {
		received += n
	}
	for _, n := range l.done {
		done += n
	}
	return received, done
}

// Deliveries returns the deliveries of id, in the order they reached the
// ledger.
func (l *Ledger) Deliveries(id string) []Delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Delivery(nil), l.log[id]...)
}

// Working returns how many deliveries the ledger is working on now.
func (l *Ledger) Working() int { return int(l.working.Load()) }

// WorkingOn returns the IDs of the events the ledger is working on now.
func (l *Ledger) WorkingOn() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Collect(maps.Keys(l.inWork))
}

// lock takes the lock of event id and returns its unlock.
func (l *Ledger) lock(id string) func() {
	l.mu.Lock()
	m := l.locks[id]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[id] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// Received returns a copy of the deliveries received, by ID.
func (l *Ledger) Received() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.received)
}

// RecordBodies makes the ledger keep the last body of each ID, for Body.
// Off by default: a long run would keep every body.
func (l *Ledger) RecordBodies() {
	l.mu.Lock()
	if l.bodies == nil {
		l.bodies = map[string][]byte{}
	}
	l.mu.Unlock()
}

// Body returns the last body received with id. It panics without
// RecordBodies, so that a test cannot read "no body" by mistake.
func (l *Ledger) Body(id string) []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bodies == nil {
		panic("ledger: Body without RecordBodies")
	}
	return l.bodies[id]
}

// Faults returns how many crashes, hangs and non-2xx answers the ledger
// gave.
func (l *Ledger) Faults() int64 { return l.faults.Load() }

func (l *Ledger) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("Sangho-Event-ID")
	prior, marked := r.Header[PriorAttemptHeader]
	d := Delivery{Marked: marked, Began: time.Now()}
	if marked {
		d.PriorAttempt = prior[0]
	}
	l.working.Add(1)
	defer l.working.Add(-1)
	l.mu.Lock()
	l.received[id]++
	n := l.received[id]
	i := len(l.log[id])
	l.log[id] = append(l.log[id], d)
	l.inWork[id]++
	if l.bodies != nil {
		l.bodies[id] = body
	}
	behave := l.behave
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.log[id][i].Left = time.Now()
		if l.inWork[id]--; l.inWork[id] == 0 {
			delete(l.inWork, id)
		}
		l.mu.Unlock()
	}()
	var a Action
	if behave != nil {
		a = behave(id, n)
	}
	if a.Status == 0 {
		a.Status = http.StatusOK
	}
	if a.Crash {
		l.faults.Add(1)
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if a.CheckIfMarked {
		// The event's lock is held through the work and its record, as
		// a row lock is through the transaction: a marked delivery that
		// arrives while another works waits for its outcome.
		defer l.lock(id)()
		l.mu.Lock()
		doneBefore := marked && l.done[id] > 0
		l.log[id][i].DoneBefore = doneBefore
		l.mu.Unlock()
		if doneBefore { // "already done": answered as told, without the work
			w.Header().Set("X-Backend", "ledger")
			w.WriteHeader(a.Status)
			fmt.Fprintf(w, `{"app":"%s"}`, id)
			return
		}
	}
	if a.Delay > 0 && a.RollBack {
		select {
		case <-time.After(a.Delay):
		case <-r.Context().Done():
			return // the request went away: the work is rolled back
		}
	} else if a.Delay > 0 {
		time.Sleep(a.Delay) // the work completes whatever the client does
	}
	if a.Hang > 0 {
		l.faults.Add(1)
		time.Sleep(a.Hang)
	}
	if a.Status >= 200 && a.Status <= 299 {
		l.mu.Lock()
		l.done[id]++
		l.log[id][i].Ended = time.Now()
		l.mu.Unlock()
	} else {
		l.faults.Add(1)
	}
	w.Header().Set("X-Backend", "ledger")
	w.WriteHeader(a.Status)
	fmt.Fprintf(w, `{"app":"%s"}`, id)
}

// Answer is what a delivery sent by Post got back, and when.
type Answer struct {
	Status int
	Err    error // the client's: e.g. its timeout passed first
	At     time.Time
}

// Post sends the delivery of event id (an empty JSON body, the ID in
// Sangho-Event-ID, marked with PriorAttemptHeader if marked) to url in
// the background, as Caddy's reverse_proxy would, giving up after
// timeout; the channel gets its answer.
func Post(url, id string, marked bool, timeout time.Duration) <-chan Answer {
	ch := make(chan Answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
		req.Header.Set("Sangho-Event-ID", id)
		if marked {
			req.Header.Set(PriorAttemptHeader, "unknown")
		}
		resp, err := (&http.Client{Timeout: timeout}).Do(req)
		if err != nil {
			ch <- Answer{Err: err, At: time.Now()}
			return
		}
		resp.Body.Close()
		ch <- Answer{Status: resp.StatusCode, At: time.Now()}
	}()
	return ch
}
