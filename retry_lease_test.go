package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// gatedStore fails every Commit while commitDown is set (a store down
// just as the backend answered 2xx), and every Forget while forgetDown
// is set (the operator's forget reaching a store that does not answer).
type gatedStore struct {
	dedup.Store
	commitDown, forgetDown atomic.Bool
	commitsUntil           atomic.Int64 // unix nanos: Commits fail before then
}

func (s *gatedStore) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	if s.commitDown.Load() || time.Now().UnixNano() < s.commitsUntil.Load() {
		return false, errors.New("i/o timeout")
	}
	return s.Store.Commit(ctx, key, token, rec, retention)
}

func (s *gatedStore) Forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	if s.forgetDown.Load() {
		return dedup.Entry{}, false, errors.New("connection refused")
	}
	return s.Store.Forget(ctx, key, force)
}

// gatedHandler is newTestHandler (configure, its log observer) on a
// gatedStore in front of its store.
func gatedHandler(t *testing.T, configure func(*Handler)) (*Handler, *gatedStore, *observer.ObservedLogs) {
	t.Helper()
	h, logs := newTestHandler(t, configure)
	st := &gatedStore{Store: h.store}
	h.store = st
	return h, st, logs
}

// processedWithRetry serves id to h, its backend answering 200 while the
// store's commits fail, and checks that the commit went to the retries.
func processedWithRetry(t *testing.T, h *Handler, id string) (key string) {
	t.Helper()
	ok := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(200); return nil })
	if _, repl, _ := serve(h, signedRequest(eventBody(id), ""), ok); outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%s: %q, want processed", id, outcomeOf(repl))
	}
	key = h.KeyPrefix + id
	if !commitRetries.pending(h.storeData, key) {
		t.Fatalf("%s: the commit is not being retried", id)
	}
	return key
}

// TestForgetThatFailsKeepsCommitRetries: an operator's forget that the
// store does not answer forgot nothing, so it must not stop the commit
// retries of the event: the backend processed it, and without its done
// record the next redelivery is processed again.
func TestForgetThatFailsKeepsCommitRetries(t *testing.T) {
	h, st, _ := gatedHandler(t, nil)
	st.commitDown.Store(true)
	key := processedWithRetry(t, h, "evt_mut_forget_fails")
	st.forgetDown.Store(true)
	if _, _, err := h.forget(context.Background(), key, true); err == nil {
		t.Fatal("the forget did not fail")
	}
	st.forgetDown.Store(false)
	st.commitDown.Store(false)
	waitFor(t, "the retry to end", func() bool { return !commitRetries.pending(h.storeData, key) })
	if e, _ := h.store.Get(context.Background(), key); !strings.HasPrefix(e.Value, dedup.DonePrefix) {
		t.Fatalf("after a forget that failed, the retry did not write the done record: %q", e.Value)
	}
}

// TestFailedForgetAfterAForgetKeepsRetriesStopped: a forced forget
// stopped the retries; a second forget that fails (the store gone
// again) must not start them again.
func TestFailedForgetAfterAForgetKeepsRetriesStopped(t *testing.T) {
	h, st, _ := gatedHandler(t, nil)
	st.commitDown.Store(true)
	key := processedWithRetry(t, h, "evt_mut_forget_twice")
	if _, deleted, err := h.forget(context.Background(), key, true); err != nil || !deleted {
		t.Fatalf("forced forget: %v %v", deleted, err)
	}
	st.forgetDown.Store(true)
	if _, _, err := h.forget(context.Background(), key, true); err == nil {
		t.Fatal("the second forget did not fail")
	}
	st.forgetDown.Store(false)
	st.commitDown.Store(false)
	waitFor(t, "the retry to end", func() bool { return !commitRetries.pending(h.storeData, key) })
	if e, _ := h.store.Get(context.Background(), key); e.Value != "" {
		t.Fatalf("the retry wrote %q back after the operator's forget", e.Value)
	}
}

// TestCommitRetriedOftenDuringAnOutage: retries come at most every
// 250 ms, so the done record lands soon after a store outage of
// 1.7 s ends (before the provider's next redelivery), and
// they go on that long (not given up).
func TestCommitRetriedOftenDuringAnOutage(t *testing.T) {
	h, st, _ := gatedHandler(t, nil)
	outage := 1700 * time.Millisecond
	st.commitsUntil.Store(time.Now().Add(outage).UnixNano())
	start := time.Now()
	key := processedWithRetry(t, h, "evt_mut_outage")
	// Retries at most 250 ms apart land within about 250 ms of its end;
	// 1.2 s leaves room for a loaded machine, and still fails retries
	// whose gaps double without a cap (the 6th at 3.15 s).
	deadline := start.Add(outage + 1200*time.Millisecond)
	for {
		if e, _ := h.store.Get(context.Background(), key); strings.HasPrefix(e.Value, dedup.DonePrefix) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the done record did not land within %v of the outage's end (retried at most every 250 ms)", 1200*time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "the retry to end", func() bool { return !commitRetries.pending(h.storeData, key) })
}

// TestCommitRetriesAbandonedAtExitCountsEach: at exit, each background
// commit retry still failing after the grace is an event whose done
// record was never written, counted in
// caddy_sangho_dedup_commit_errors_total: two of one handler count two.
func TestCommitRetriesAbandonedAtExitCountsEach(t *testing.T) {
	defer func(g time.Duration) { exitCommitGrace = g }(exitCommitGrace)
	exitCommitGrace = 100 * time.Millisecond
	h, st, logs := gatedHandler(t, nil)
	st.commitDown.Store(true)
	keys := []string{processedWithRetry(t, h, "evt_mut_exit_1"), processedWithRetry(t, h, "evt_mut_exit_2")}
	defer func() { // stop the retries, which would go on for dedup.CommitRetryFor
		for _, key := range keys {
			_, _, _ = h.forget(context.Background(), key, true)
		}
		waitFor(t, "the retries to end", func() bool { return pendingCommits.byLogger()[h.logger] == 0 })
	}()
	// Other tests' handlers may have retries pending too: each counts.
	var want int64
	for _, n := range pendingCommits.byLogger() {
		want += n
	}
	if want < 2 {
		t.Fatalf("%d retries pending, want this test's 2 at least", want)
	}
	before := testutil.ToFloat64(metrics.commitErr)
	drainCommitRetries(context.Background())
	// Each counts: this handler's 2 at least, and no more than were
	// pending (another test's retry may end meanwhile).
	if got := testutil.ToFloat64(metrics.commitErr) - before; got < 2 || got > float64(want) || want == 2 && got != 2 {
		t.Fatalf("abandoned retries counted: %v, want 2 to %d", got, want)
	}
	if l := logs.FilterMessage("commit retries abandoned at exit").All(); len(l) != 1 || l[0].ContextMap()["events"] != int64(2) {
		t.Fatalf("abandoned retries logged: %+v, want one line with events 2", l)
	}
}

// TestCommitRetriedWithinARenewedLease: a renewal extends the lease as
// the handler knows it (its expiry), not only in the store: a backend
// that worked for twice lock_ttl, its lease renewed, and whose commit
// landed at the first retry, is logged "commit retried" (info), not
// "commit retried after lease expired" (error), which tells the
// operator that another delivery may have processed the event too.
func TestCommitRetriedWithinARenewedLease(t *testing.T) {
	const ttl = 600 * time.Millisecond // renewals every 200ms
	h, st, logs := gatedHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(ttl) })
	st.commitDown.Store(true)
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(2*ttl + ttl/6)
		w.WriteHeader(200)
		return nil
	})
	if _, repl, _ := serve(h, signedRequest(eventBody("evt_mut_renewed"), ""), slow); outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%q, want processed", outcomeOf(repl))
	}
	st.commitDown.Store(false) // the first retry, 50ms on, lands
	key := h.KeyPrefix + "evt_mut_renewed"
	waitFor(t, "the retry to end", func() bool { return !commitRetries.pending(h.storeData, key) })
	if n := logs.FilterMessage("commit retried after lease expired").Len(); n != 0 {
		t.Fatalf("a commit retried %v after the last renewal logged as after the lease expired", 50*time.Millisecond)
	}
	if n := logs.FilterMessage("commit retried").Len(); n != 1 {
		t.Fatalf("%d commit retried lines, want 1", n)
	}
}

// TestLeaseLostEndsRenewals: a renewal that finds the lease taken over
// is the last: the backend still at work for several renewal periods
// after it is one lost lease, logged and counted once (not once per
// renewal period, which would inflate caddy_sangho_dedup_lease_lost_total).
func TestLeaseLostEndsRenewals(t *testing.T) {
	const ttl = 300 * time.Millisecond // renewals every 100ms
	h, logs := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(ttl)
		h.KeyPrefix = "mut_lease_lost:"
	})
	id := "evt_mut_lost"
	key := h.KeyPrefix + id
	lost := func() int { return logs.FilterMessage("lease lost").FilterField(zap.String("during", "renewal")).Len() }
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		ctx := context.Background()
		if _, _, err := h.store.Forget(ctx, key, true); err != nil {
			t.Error(err)
		}
		if res, _, err := h.store.Claim(ctx, key, "another", time.Minute); err != nil || res != dedup.Claimed {
			t.Errorf("taking the lease over: %v %v", res, err)
		}
		waitFor(t, "a renewal to find the lease lost", func() bool { return lost() > 0 })
		time.Sleep(4 * ttl / 3) // four more renewal periods at work
		w.WriteHeader(200)
		return nil
	})
	if w, _, _ := serve(h, signedRequest(eventBody(id), ""), next); w.Code != 200 {
		t.Fatalf("%d", w.Code)
	}
	if n := lost(); n != 1 {
		t.Fatalf(`%d "lease lost" lines during renewal, want 1: renewals went on after the lease was lost`, n)
	}
}

// TestOneNameOnTwoStoresRefused: two handlers with one name and one
// key_prefix but different stores are two endpoints under one name:
// the admin API (forget, look-up by name) would reach the first one's
// store only. Refused, as a name on two key_prefixes is.
func TestOneNameOnTwoStoresRefused(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	mem := &Handler{Secrets: []string{secret1}, KeyPrefix: "mut_name:", Name: "mut_name", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	if err := mem.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	file := &Handler{Secrets: []string{secret1}, KeyPrefix: "mut_name:", Name: "mut_name",
		StoreRaw: json.RawMessage(`{"type":"file","path":"` + filepath.Join(t.TempDir(), "dedup.db") + `"}`)}
	err := file.Provision(ctx)
	if err == nil {
		_ = file.Cleanup()
	}
	if err == nil || !strings.Contains(err.Error(), `named "mut_name"`) {
		t.Fatalf("one name on two stores: %v, want refused", err)
	}
}

// TestSecretSetsThatConcatenateAlikeAreDifferent: the secret sets
// {"whsec_mut1", "whsec_mut2"} and {"whsec_mut1whsec_mut2"} are
// different endpoints (no secret in common) and may not share one store
// and key_prefix: else one answers the other's events as duplicates.
func TestSecretSetsThatConcatenateAlikeAreDifferent(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &Handler{Secrets: []string{"whsec_mut1", "whsec_mut2"}, KeyPrefix: "mut_concat:", Name: "one", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	b := &Handler{Secrets: []string{"whsec_mut1whsec_mut2"}, KeyPrefix: "mut_concat:", Name: "two", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	err := b.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "different secrets") {
		t.Fatalf("two secret sets on one store and key_prefix: %v, want refused", err)
	}
}
