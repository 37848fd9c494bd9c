package sanghodedup

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// atTheBackend sends body to h and returns once its backend works on it;
// the backend answers 200 when finish is called, which returns once the
// delivery is settled.
func atTheBackend(h *Handler, body string) (finish func()) {
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		serve(h, signedRequest(body, ""), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			close(entered)
			<-release
			return nil
		}))
		close(done)
	}()
	<-entered
	return func() {
		close(release)
		<-done
	}
}

// TestLeaseRenewal: a backend slower than lock_ttl keeps its lease, and
// a duplicate meanwhile gets 409.
func TestLeaseRenewal(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(300 * time.Millisecond) })
	finish := atTheBackend(h, bodyA)
	next := &countingNext{}
	for i := 0; i < 6; i++ { // 6 × 200ms: four times lock_ttl
		time.Sleep(200 * time.Millisecond)
		if w, _, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 409 {
			t.Fatalf("after %dms in flight: %d, want 409", (i+1)*200, w.Code)
		}
	}
	finish()
	if next.calls.Load() != 0 {
		t.Fatal("a duplicate reached the backend while the first was in flight")
	}
}

// TestLeaseLost: another delivery takes the lease over while the backend
// works (here: an operator forgets the lease, another claims it). The
// next renewal finds it lost, then the commit: each is logged ("lease
// lost", during renewal, then commit) and counted, and the event is
// recorded as done all the same, since the backend did process it.
func TestLeaseLost(t *testing.T) {
	h, logs := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(300 * time.Millisecond)
		h.KeyPrefix = "lease_lost:"
	})
	key := h.KeyPrefix + "evt_1QZtest000000000001"
	lost := func(during string) int {
		return logs.FilterMessage("lease lost").FilterField(zap.String("during", during)).Len()
	}
	before := testutil.ToFloat64(metrics.leaseLost)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		ctx := context.Background()
		if _, _, err := h.store.Forget(ctx, key, true); err != nil {
			t.Error(err)
		}
		if res, _, err := h.store.Claim(ctx, key, "another", time.Minute); err != nil || res != dedup.Claimed {
			t.Errorf("taking the lease over: %v %v", res, err)
		}
		for deadline := time.Now().Add(10 * time.Second); lost("renewal") == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("no renewal found the lease lost within 10 s")
				break
			}
		}
		w.WriteHeader(200)
		return nil
	})
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%d %q", w.Code, outcomeOf(repl))
	}
	if lost("renewal") != 1 || lost("commit") != 1 {
		t.Errorf(`"lease lost" lines: %d during renewal, %d during commit; want 1 and 1`, lost("renewal"), lost("commit"))
	}
	if d := testutil.ToFloat64(metrics.leaseLost) - before; d != 2 {
		t.Errorf("caddy_sangho_dedup_lease_lost_total moved by %v, want 2", d)
	}
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); outcomeOf(repl) != outcomeDuplicate {
		t.Errorf("after the lost lease's commit: %q, want duplicate", outcomeOf(repl))
	}
}

// lateClaim answers its first Claim late: the claim lands in the store
// at once, then its answer is held until release is closed (a reply
// held up by a stalled network, a lock wait, a disk).
type lateClaim struct {
	dedup.Store
	landed, release chan struct{}
	calls           atomic.Int32
}

func (s *lateClaim) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	res, found, err := s.Store.Claim(ctx, key, token, ttl)
	if s.calls.Add(1) == 1 {
		close(s.landed)
		<-s.release
	}
	return res, found, err
}

// TestLateClaimAnswerIsClaimedAgain: a claim whose answer comes after
// its lease ran out is not passed on as it is: another delivery may
// have taken the lease over meanwhile and be at the backend. The
// handler claims again with the same token first: taken over, the late
// delivery gets 409 and the backend gets the event once; not taken
// over, the lease lives lock_ttl again and the event is processed.
// (Found by review on PostgreSQL: a claim that waited on a row lock
// longer than lock_ttl wrote a lease already run out, and a redelivery
// right after was passed on beside it.)
func TestLateClaimAnswerIsClaimedAgain(t *testing.T) {
	const ttl = 100 * time.Millisecond
	type answer struct {
		code    int
		outcome string
	}
	for _, c := range []struct {
		id   string
		then string // what another delivery does while the first's answer is late
		want answer
	}{
		{"evt_late_taken_over", "at the backend", answer{409, outcomeInFlight}},
		{"evt_late_done", "processed", answer{200, outcomeDuplicate}},
		{"evt_late_alone", "", answer{200, outcomeProcessed}},
	} {
		h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
		st := &lateClaim{Store: h.store, landed: make(chan struct{}), release: make(chan struct{})}
		h.store = st
		next := &countingNext{}
		first := make(chan answer, 1)
		go func() {
			w, repl, _ := serve(h, signedRequest(eventBody(c.id), ""), next)
			first <- answer{w.Code, outcomeOf(repl)}
		}()
		<-st.landed
		time.Sleep(2 * ttl) // the first lease has run out, its answer not yet known
		var a answer
		switch c.then {
		case "at the backend":
			// The redelivery's backend works until the late one is answered.
			atBackend, second := make(chan struct{}), make(chan answer, 1)
			slow := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
				close(atBackend)
				a = <-first
				w.WriteHeader(200)
				return nil
			}}
			go func() {
				w, repl, _ := serve(h, signedRequest(eventBody(c.id), ""), slow)
				second <- answer{w.Code, outcomeOf(repl)}
			}()
			<-atBackend
			close(st.release)
			if b := <-second; b != (answer{200, outcomeProcessedMarked}) {
				t.Fatalf("%s: the redelivery: %v, want 200 processed_marked", c.id, b)
			}
			next.calls.Add(slow.calls.Load())
		case "processed":
			if w, repl, _ := serve(h, signedRequest(eventBody(c.id), ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked {
				t.Fatalf("%s: the redelivery: %d %q, want 200 processed_marked", c.id, w.Code, outcomeOf(repl))
			}
			close(st.release)
			a = <-first
		default:
			close(st.release)
			a = <-first
		}
		if n := next.calls.Load(); n != 1 {
			t.Fatalf("%s: the backend got the event %d times, want 1 (the late delivery: %v)", c.id, n, a)
		}
		if a != c.want {
			t.Errorf("%s: the late delivery got %v, want %v", c.id, a, c.want)
		}
	}
}

// twiceLate answers its first two Claims late: each lands in the store
// at once, then its answer is held until its release is closed.
type twiceLate struct {
	dedup.Store
	landed, release [2]chan struct{}
	calls           atomic.Int32
}

func (s *twiceLate) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	res, found, err := s.Store.Claim(ctx, key, token, ttl)
	if n := s.calls.Add(1); n <= 2 {
		close(s.landed[n-1])
		<-s.release[n-1]
	}
	return res, found, err
}

// TestLateReclaimAnswerIsClaimedAgain: the claim made again after a
// late answer can be answered late too (the same stalled network or row
// lock), its lease run out meanwhile and taken over by a redelivery now
// at the backend. The handler claims again until a claim answers in
// time, so the late delivery gets 409 and the backend the event once.
// (Found by review of TestLateClaimAnswerIsClaimedAgain's fix, which
// claimed again once and did not time that claim.)
func TestLateReclaimAnswerIsClaimedAgain(t *testing.T) {
	const ttl = 100 * time.Millisecond
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	st := &twiceLate{Store: h.store}
	for i := range 2 {
		st.landed[i], st.release[i] = make(chan struct{}), make(chan struct{})
	}
	h.store = st
	const id = "evt_twice_late"
	next := &countingNext{}
	late := make(chan int, 1)
	go func() {
		w, _, _ := serve(h, signedRequest(eventBody(id), ""), next)
		late <- w.Code
	}()
	<-st.landed[0]
	time.Sleep(2 * ttl)
	close(st.release[0]) // the first answer, late: the handler claims again
	<-st.landed[1]
	time.Sleep(2 * ttl) // the lease claimed again has run out too
	// A redelivery takes it over, marked, and its backend lets the late
	// claim's answer come while it works.
	var lateCode int
	slow := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		close(st.release[1])
		lateCode = <-late
		w.WriteHeader(200)
		return nil
	}}
	w, repl, _ := serve(h, signedRequest(eventBody(id), ""), slow)
	if w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked {
		t.Fatalf("the redelivery: %d %q, want 200 processed_marked", w.Code, outcomeOf(repl))
	}
	if n := next.calls.Load() + slow.calls.Load(); n != 1 || lateCode != http.StatusConflict {
		t.Fatalf("the backend got the event %d times, want 1; the late delivery got %d, want 409", n, lateCode)
	}
}

// slowClaims answers every Claim after delay.
type slowClaims struct {
	dedup.Store
	delay time.Duration
	calls atomic.Int32
}

func (s *slowClaims) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	s.calls.Add(1)
	res, found, err := s.Store.Claim(ctx, key, token, ttl)
	time.Sleep(s.delay)
	return res, found, err
}

// TestClaimsAlwaysLateAreAStoreError: a store that answers every claim
// after lock_ttl/3 is failing: after the claim and lateClaims more, the
// delivery gets the store error (503), nothing reaches the backend, and
// its lease is released, so the sender's retry is not made to wait.
func TestClaimsAlwaysLateAreAStoreError(t *testing.T) {
	const ttl = 300 * time.Millisecond
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	st := &slowClaims{Store: h.store, delay: ttl/3 + 20*time.Millisecond}
	h.store = st
	const id = "evt_always_late"
	next := &countingNext{}
	w, repl, _ := serve(h, signedRequest(eventBody(id), ""), next)
	if w.Code != http.StatusServiceUnavailable || outcomeOf(repl) != outcomeStoreError {
		t.Fatalf("%d %q, want 503 store_error", w.Code, outcomeOf(repl))
	}
	if n := st.calls.Load(); n != 1+lateClaims || next.calls.Load() != 0 {
		t.Fatalf("%d claims, the backend reached %d times; want %d and 0", n, next.calls.Load(), 1+lateClaims)
	}
	if res, _, err := st.Store.Claim(context.Background(), h.KeyPrefix+id, "probe", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("the key after the store error: %v %v; want it released", res, err)
	}
}

// stallFirstRenew makes the first Renew wait until its context ends (a
// store that hangs once), then lets the others through.
type stallFirstRenew struct {
	dedup.Store
	calls atomic.Int32
}

func (s *stallFirstRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return s.Store.Renew(ctx, key, token, ttl)
}

// TestRenewalRetriedBeforeTheLeaseRunsOut: a renewal that waited its
// whole timeout (lock_ttl/3) ends at two thirds of the lease; the next,
// lock_ttl/3 later, came as the lease ran out, and was refused: one slow
// answer of the store lost the lease, and a redelivery went on beside the
// backend still at work (found by review). It is tried again before the
// lease runs out, and the lease is kept.
func TestRenewalRetriedBeforeTheLeaseRunsOut(t *testing.T) {
	const ttl = 1200 * time.Millisecond // renewals every 400ms
	h, logs := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	st := &stallFirstRenew{Store: h.store}
	h.store = st
	finish := atTheBackend(h, bodyA)
	time.Sleep(ttl + ttl/3) // the stalled renewal ended at 800ms; the lease from the claim ran out at 1200ms
	next := &countingNext{}
	w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
	finish()
	if w.Code != http.StatusConflict || next.calls.Load() != 0 {
		t.Errorf("a redelivery while the backend works, after one stalled renewal: %d %q (backend reached %d times), want 409", w.Code, outcomeOf(repl), next.calls.Load())
	}
	if n := logs.FilterMessage("lease lost").Len(); n != 0 {
		t.Errorf("%d lease lost lines after one stalled renewal, want 0", n)
	}
	if n := logs.FilterMessage("renewal failed").Len(); n != 1 {
		t.Errorf("%d renewal failed lines, want 1", n)
	}
}

// slowFirstRenew counts renewals and signals the first, which takes a
// while (a slow store), so that the delivery is settled while it runs.
type slowFirstRenew struct {
	dedup.Store
	entered chan struct{}
	renews  atomic.Int32
}

func (s *slowFirstRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if s.renews.Add(1) == 1 {
		close(s.entered)
		time.Sleep(100 * time.Millisecond)
	}
	return s.Store.Renew(ctx, key, token, ttl)
}

// TestRenewalUnderWayAtSettleIsTheLast: a renewal under way when the
// next handler returns finishes (stop waits for it), and its timer,
// set again, renews no more. A held event's lease then runs out at
// lock_ttl, and the next delivery is processed, marked; renewals that
// went on would hold the event, answered 409, for as long as Caddy runs.
func TestRenewalUnderWayAtSettleIsTheLast(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(300 * time.Millisecond) })
	st := &slowFirstRenew{Store: h.store, entered: make(chan struct{})}
	h.store = st
	timeout := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		<-st.entered // a renewal is under way
		return caddyhttp.Error(504, errors.New("net/http: timeout awaiting response headers"))
	})
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), timeout); outcomeOf(repl) != outcomeHeld {
		t.Fatalf("first attempt: %q, want held", outcomeOf(repl))
	}
	renewed := st.renews.Load()
	time.Sleep(500 * time.Millisecond) // past lock_ttl from the last renewal
	if n := st.renews.Load(); n != renewed {
		t.Fatalf("%d renewals after the delivery was settled", n-renewed)
	}
	next := &countingNext{}
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked {
		t.Fatalf("after lock_ttl: %d %q, want 200 processed_marked", w.Code, outcomeOf(repl))
	}
}

// gatewayTimeout is a next handler whose backend's fate is unknown
// (held until lock_ttl).
var gatewayTimeout = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	return caddyhttp.Error(504, errors.New("net/http: timeout awaiting response headers"))
})

// TestLateClaimAgainOverAMarkIsMarked: a claim answered late is made
// again; if meanwhile another delivery took the event over and was held
// (its fate unknown) and its lease ran out, the claim made again takes
// over that mark: the late delivery must reach the backend marked, as
// any delivery that takes over a mark does.
func TestLateClaimAgainOverAMarkIsMarked(t *testing.T) {
	const ttl = 100 * time.Millisecond
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	st := &lateClaim{Store: h.store, landed: make(chan struct{}), release: make(chan struct{})}
	h.store = st
	var got []string
	next := priorAttemptBackend(&got)
	late := make(chan string, 1)
	go func() {
		_, repl, _ := serve(h, signedRequest(bodyA, ""), next)
		late <- outcomeOf(repl)
	}()
	<-st.landed
	time.Sleep(2 * ttl) // the late claim's lease ran out: a redelivery takes it over, and is held
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), gatewayTimeout); outcomeOf(repl) != outcomeHeld {
		t.Fatalf("the redelivery: %q, want held", outcomeOf(repl))
	}
	time.Sleep(2 * ttl) // its lease ran out too: a mark
	close(st.release)
	if o := <-late; o != outcomeProcessedMarked || len(got) != 1 || got[0] != "unknown" {
		t.Fatalf("the late delivery: %q, the backend saw Sangho-Dedup-Prior-Attempt %q; want processed_marked, unknown", o, got)
	}
}

// TestClaimsAlwaysLateOverAMarkKeepIt: a delivery that took over a
// mark, whose claims then all answer late (a store error, 503), keeps
// its lease until lock_ttl rather than release it, so that it lapses
// into a mark again: the earlier attempt's fate is still unknown, and
// the next delivery must still be marked.
func TestClaimsAlwaysLateOverAMarkKeepIt(t *testing.T) {
	const ttl = 300 * time.Millisecond
	h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	store := h.store
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), gatewayTimeout); outcomeOf(repl) != outcomeHeld {
		t.Fatalf("first attempt: %q, want held", outcomeOf(repl))
	}
	time.Sleep(ttl + 50*time.Millisecond) // a mark
	h.store = &slowClaims{Store: store, delay: ttl/3 + 20*time.Millisecond}
	next := &countingNext{}
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != http.StatusServiceUnavailable || outcomeOf(repl) != outcomeStoreError {
		t.Fatalf("claims always late: %d %q, want 503 store_error", w.Code, outcomeOf(repl))
	}
	h.store = store
	time.Sleep(ttl + 50*time.Millisecond)
	var got []string
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), priorAttemptBackend(&got)); w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked || len(got) != 1 || got[0] != "unknown" {
		t.Fatalf("the next delivery: %d %q, Sangho-Dedup-Prior-Attempt %q; want processed_marked, unknown", w.Code, outcomeOf(repl), got)
	}
	if next.calls.Load() != 0 {
		t.Fatal("a delivery whose claims all answered late reached the backend")
	}
}
