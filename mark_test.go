package sanghodedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Issue 26: a delivery that takes over an event whose earlier attempt's
// fate is unknown, or that the handler passes on unchecked, reaches the
// backend marked, so that the backend can check its own records.

func priorAttemptOf(repl *caddy.Replacer) string {
	v, _ := repl.GetString("http.sangho_dedup.prior_attempt")
	return v
}

// redisHandler is a handler on a real Redis (which keeps marks), with a
// short lock_ttl.
func redisHandler(t *testing.T, lockTTL time.Duration) (*Handler, func() []string) {
	srv := startRedis(t)
	h, logs := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"]}`)
		h.LockTTL = caddy.Duration(lockTTL)
		h.KeyPrefix = "mark_" + testPrefix(t) + ":"
	})
	marked := func() []string {
		var ids []string
		for _, e := range logs.FilterMessage("event passed on marked").All() {
			ids = append(ids, e.ContextMap()["event_id"].(string))
		}
		return ids
	}
	return h, marked
}

// priorAttemptBackend is a backend that answers 200 and keeps the
// Sangho-Dedup-Prior-Attempt values of the last request it got, under
// any spelling that a backend may read as that header: with '_' for
// '-' (CGI and FastCGI turn both into HTTP_SANGHO_DEDUP_PRIOR_ATTEMPT).
func priorAttemptBackend(got *[]string) *countingNext {
	return &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		*got = nil
		for k, vs := range r.Header {
			if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), "Sangho-Dedup-Prior-Attempt") {
				*got = append(*got, vs...)
			}
		}
		w.WriteHeader(200)
		return nil
	}}
}

// TestReclaimedDeliveryIsMarked: the first attempt is held (a timeout:
// its fate unknown); once its lease ran out, the retry reclaims the
// event and reaches the backend with Sangho-Dedup-Prior-Attempt:
// unknown, the placeholder says unknown, its outcome is
// processed_marked (counted), one log line names the event; it is
// committed as any other, so the next delivery is a duplicate.
func TestReclaimedDeliveryIsMarked(t *testing.T) {
	h, marked := redisHandler(t, 300*time.Millisecond)
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(504, errors.New("net/http: timeout awaiting response headers"))
	})
	_, repl, _ := serve(h, signedRequest(bodyA, ""), held)
	if outcomeOf(repl) != outcomeHeld || priorAttemptOf(repl) != "" {
		t.Fatalf("first attempt: outcome %q, prior attempt %q; want held, unmarked", outcomeOf(repl), priorAttemptOf(repl))
	}
	time.Sleep(400 * time.Millisecond)
	var got []string
	next := priorAttemptBackend(&got)
	before := testutil.ToFloat64(h.outcomes[outcomeProcessedMarked])
	w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 200 || len(got) != 1 || got[0] != "unknown" {
		t.Fatalf("retry after the lease ran out: %d, header %q; want 200 and unknown", w.Code, got)
	}
	if outcomeOf(repl) != outcomeProcessedMarked || priorAttemptOf(repl) != "unknown" {
		t.Fatalf("retry: outcome %q, prior attempt %q; want processed_marked, unknown", outcomeOf(repl), priorAttemptOf(repl))
	}
	if d := testutil.ToFloat64(h.outcomes[outcomeProcessedMarked]) - before; d != 1 {
		t.Fatalf("processed_marked counter moved by %v", d)
	}
	if ids := marked(); len(ids) != 1 || ids[0] != "evt_1QZtest000000000001" {
		t.Fatalf("marked log lines: %v", ids)
	}
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), next); outcomeOf(repl) != outcomeDuplicate {
		t.Fatalf("third delivery: %q, want duplicate", outcomeOf(repl))
	}
}

// TestReclaimedDeliveryLikeClaimed: a reclaimed delivery is a claimed
// one, its lease renewed while the backend works (a concurrent delivery
// gets 409), except for a non-2xx answer: the earlier attempt's fate is
// still unknown (the backend may have failed before it checked), so its
// lease is held until lock_ttl, not released, and lapses into a mark
// again: the next delivery gets 409 until then, and is marked after.
// (Released, the next delivery went on unmarked.)
func TestReclaimedDeliveryLikeClaimed(t *testing.T) {
	h, _ := redisHandler(t, 300*time.Millisecond)
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return errors.New("boom") })
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), held); outcomeOf(repl) != outcomeHeld {
		t.Fatalf("first attempt: %q, want held", outcomeOf(repl))
	}
	time.Sleep(400 * time.Millisecond)
	var concurrent atomic.Int32
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(800 * time.Millisecond) // past lock_ttl: renewals keep the lease
		if w2, _, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); w2.Code == 409 {
			concurrent.Store(409)
		}
		w.WriteHeader(500)
		return nil
	})
	_, repl, _ := serve(h, signedRequest(bodyA, ""), slow)
	if concurrent.Load() != 409 {
		t.Fatal("a delivery while the reclaimed one worked was not answered 409")
	}
	if outcomeOf(repl) != outcomeHeld || priorAttemptOf(repl) != "unknown" {
		t.Fatalf("reclaimed, backend 500: outcome %q, prior attempt %q; want held, unknown", outcomeOf(repl), priorAttemptOf(repl))
	}
	var got []string
	next := priorAttemptBackend(&got)
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 409 || len(got) != 0 {
		t.Fatalf("right after: %d %q, header %q; want 409, the backend not reached", w.Code, outcomeOf(repl), got)
	}
	time.Sleep(400 * time.Millisecond)
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked || len(got) != 1 || got[0] != "unknown" {
		t.Fatalf("after lock_ttl: %d %q, header %q; want 200 processed_marked, unknown", w.Code, outcomeOf(repl), got)
	}
}

// TestPriorAttemptHeaderFromClientStripped: a client's own
// Sangho-Dedup-Prior-Attempt never reaches the backend, nor one spelled
// with '_' (a review: php_fastcgi reads either as the same variable): a
// first delivery arrives without it, and a delivery passed on unchecked
// (on_store_error pass) carries exactly the handler's "unknown".
func TestPriorAttemptHeaderFromClientStripped(t *testing.T) {
	var got []string
	next := priorAttemptBackend(&got)
	forged := func() *http.Request {
		r := signedRequest(bodyA, "")
		r.Header.Add("Sangho-Dedup-Prior-Attempt", "none")
		r.Header.Add("sangho-dedup-prior-attempt", "unknown")
		// As Go's server keeps them: not one key with the above.
		r.Header["Sangho_dedup_prior_attempt"] = []string{"unknown"}
		r.Header["Sangho-Dedup_Prior-Attempt"] = []string{"unknown"}
		return r
	}
	h, _ := newTestHandler(t, nil)
	_, repl, _ := serve(h, forged(), next)
	if outcomeOf(repl) != outcomeProcessed || len(got) != 0 || priorAttemptOf(repl) != "" {
		t.Fatalf("new event with a forged header: %q, backend saw %q, placeholder %q; want processed, none", outcomeOf(repl), got, priorAttemptOf(repl))
	}

	srv := startRedis(t)
	srv.Kill()
	hp, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"dial_timeout":"100ms"}`)
		h.OnStoreError = "pass"
	})
	_, repl, _ = serve(hp, forged(), next)
	if outcomeOf(repl) != outcomeUnchecked || len(got) != 1 || got[0] != "unknown" || priorAttemptOf(repl) != "unknown" {
		t.Fatalf("passed unchecked: %q, backend saw %q, placeholder %q; want unchecked, exactly unknown", outcomeOf(repl), got, priorAttemptOf(repl))
	}
}

// TestServerMarkSurvivesTheClientsConnectionHeader: a client that names
// Sangho-Dedup-Prior-Attempt in its Connection header (a hop-by-hop
// header: reverse_proxy deletes every header it names) cannot make the
// handler's mark vanish on its way to the backend. Through a real
// reverse_proxy, on deliveries passed on marked (here unchecked: the
// store down, on_store_error pass; a reclaimed delivery is marked by the
// same code), in any spelling and beside other tokens. (Found by a
// hostile-input review: the backend got the retry of an event whose
// fate was unknown unmarked, and processed it twice.)
func TestServerMarkSurvivesTheClientsConnectionHeader(t *testing.T) {
	var mu sync.Mutex
	var got []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(headerPriorAttempt))
		mu.Unlock()
	}))
	t.Cleanup(backend.Close)
	srv := startRedis(t)
	srv.Kill()
	s := startCaddy(t, dedupSite(backend.Listener.Addr().String(), redisStoreLine(srv.Addr)+"\n\t\ton_store_error pass"))
	for _, conn := range []string{"Sangho-Dedup-Prior-Attempt", "keep-alive, sangho-dedup-prior-attempt", "Sangho_Dedup_Prior_Attempt,X-Other"} {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(bodyA))
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(bodyA), secret1))
		req.Header.Set("Connection", conn)
		if a := do(t, req); a.status != 200 {
			t.Fatalf("Connection: %s: %d", conn, a.status)
		}
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		if last != "unknown" {
			t.Errorf("Connection: %s: the backend got Sangho-Dedup-Prior-Attempt %q; want unknown", conn, last)
		}
	}
}

// TestServerClientGoneMidRequestHolds: the sender goes away while the
// backend works, and the backend goes on to finish (as most do: a
// payment handler commits whatever the socket does). reverse_proxy then
// writes 499 and returns nil: the handler must hold the lease, not
// release it, so that the sender's retry meanwhile gets 409 with
// Retry-After, and the event is processed once.
func TestServerClientGoneMidRequestHolds(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		var received, processed atomic.Int32
		upstreamGone := make(chan struct{}, 1)
		backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			received.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
				upstreamGone <- struct{}{}
			case <-time.After(5 * time.Second):
			}
			time.Sleep(300 * time.Millisecond) // the work goes on, then ends
			processed.Add(1)
			w.WriteHeader(200)
		}))
		t.Cleanup(backend.Close)
		s := startCaddy(t, dedupSite(backend.Listener.Addr().String(), store+"\n\t\tlock_ttl 5s"))

		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(bodyA))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(bodyA), secret1))
		errc := make(chan error, 1)
		go func() {
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for received.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the backend never got the first attempt")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel() // the sender goes away mid-request
		if err := <-errc; err == nil {
			t.Fatal("the canceled request got an answer")
		}
		select {
		case <-upstreamGone:
		case <-time.After(5 * time.Second):
			t.Fatal("reverse_proxy never canceled the upstream request")
		}
		time.Sleep(100 * time.Millisecond) // the handler settles the first attempt
		a := send(t, s.url, bodyA, "")
		if a.status != 409 || a.header.Get("Retry-After") == "" {
			t.Fatalf("retry while the backend works: %d (Retry-After %q); want 409 with Retry-After", a.status, a.header.Get("Retry-After"))
		}
		for processed.Load() == 0 {
			if time.Now().After(deadline.Add(5 * time.Second)) {
				t.Fatal("the backend never finished")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if a := send(t, s.url, bodyA, ""); a.status != 409 {
			t.Fatalf("retry after the backend finished, within lock_ttl: %d; want 409 (held)", a.status)
		}
		if received.Load() != 1 || processed.Load() != 1 {
			t.Fatalf("backend received %d, processed %d; want 1 and 1", received.Load(), processed.Load())
		}
	})
}

// TestAdminAndCommandShowAMark: a lease whose time ran out, kept as the
// mark of an attempt whose fate is unknown, is state "unknown" in the
// admin API and `caddy sangho-dedup get`, with the time its lease ran
// out; forget keeps it without force (409, saying so), and removes it
// with force.
func TestAdminAndCommandShowAMark(t *testing.T) {
	srv := startRedis(t)
	name := "marks_" + testPrefix(t)
	s := startAdminCaddy(t, dedupSite("127.0.0.1:1", redisStoreLine(srv.Addr)+"\n\t\tkey_prefix "+name+":\n\t\tname "+name))
	// a lease that ran out a second ago, as the Redis store keeps it
	rc := srv.Client(t)
	if err := rc.Set(context.Background(), name+":evt_mark", "inflight:tok.00112233445566778899aabbccddeeff;mark=604800000",
		dedup.MarkFor-time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	path := "/sangho_dedup/" + name + "/events/evt_mark"
	status, v := s.api(t, http.MethodGet, path)
	exp, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(v["expires_at"]))
	if status != 200 || v["state"] != "unknown" || !exp.Before(time.Now()) {
		t.Fatalf("GET a mark: %d %v; want state unknown, expired", status, v)
	}
	if code, out, err := s.cli(t, "get", "evt_mark"); code != 0 || err != nil || !strings.Contains(out, "evt_mark: fate unknown") ||
		!strings.Contains(out, "lease ran out") {
		t.Fatalf("caddy sangho-dedup get of a mark: %d %v\n%s", code, err, out)
	}
	if status, v := s.api(t, http.MethodDelete, path); status != 409 || !strings.Contains(fmt.Sprint(v["error"]), "fate is unknown") {
		t.Fatalf("DELETE a mark: %d %v; want 409 saying the fate is unknown", status, v)
	}
	if code, _, err := s.cli(t, "forget", "evt_mark"); code != 2 || err == nil || !strings.Contains(err.Error(), "fate is unknown") ||
		!strings.Contains(err.Error(), "--force") || strings.Contains(err.Error(), "?force") {
		t.Fatalf("forget of a mark without --force: exit %d, %v", code, err)
	}
	if code, out, err := s.cli(t, "forget", "evt_mark", "force", "true"); code != 0 || err != nil || !strings.Contains(out, "it was unknown") {
		t.Fatalf("forced forget of a mark: %d %v\n%s", code, err, out)
	}
	if status, v := s.api(t, http.MethodGet, path); status != 404 {
		t.Fatalf("after a forced forget: %d %v", status, v)
	}
}

// A 499 is the backend's own answer while the client is still there
// (release), and reverse_proxy's note of a client gone otherwise (hold).
func TestJudge499(t *testing.T) {
	if v := judge(499, nil, false, false); v != toRelease {
		t.Fatalf("499 with the client there: %v, want release", v)
	}
	if v := judge(499, nil, true, false); v != toHold {
		t.Fatalf("499 with the client gone: %v, want hold", v)
	}
	if v := judge(500, nil, true, false); v != toRelease {
		t.Fatalf("500 with the client gone: %v, want release", v)
	}
}

// seenAtHeader records the outcome placeholder as the status line goes
// out, as a deferred header reads it.
type seenAtHeader struct {
	http.ResponseWriter
	repl *caddy.Replacer
	seen string
}

func (s *seenAtHeader) WriteHeader(code int) {
	s.seen, _ = s.repl.GetString("http.sangho_dedup.outcome")
	s.ResponseWriter.WriteHeader(code)
}

// TestOutcomeAt499IsTheOneSettled: a backend's own 499 while the client
// is there, the client gone before the next handler returns: the outcome
// a deferred header got with the status line is the one settled (the
// backend's answer: released, its lease gone), not released at the line
// and held after. (Found by review.)
func TestOutcomeAt499IsTheOneSettled(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	repl := caddy.NewReplacer()
	r := signedRequest(bodyA, "").WithContext(context.WithValue(ctx, caddy.ReplacerCtxKey, repl))
	w := &seenAtHeader{ResponseWriter: httptest.NewRecorder(), repl: repl}
	next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(499)
		cancel() // the client goes away while the answer is copied
		return nil
	}}
	_ = h.ServeHTTP(w, r, next)
	if final := outcomeOf(repl); w.seen != outcomeReleased || final != outcomeReleased {
		t.Fatalf("outcome at the status line %q, after settle %q; want released at both", w.seen, final)
	}
	if e, err := h.store.Get(context.Background(), h.KeyPrefix+"evt_1QZtest000000000001"); err != nil || e.Value != "" {
		t.Fatalf("the event's entry after a 499 of the backend: %+v, %v; want none (released)", e, err)
	}
}

// TestSpanCarriesPriorAttempt: a delivery passed on marked has the span
// attribute sangho_dedup.prior_attempt "unknown"; an unmarked one none.
func TestSpanCarriesPriorAttempt(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv := startRedis(t)
	srv.Kill()
	hp, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"dial_timeout":"100ms"}`)
		h.OnStoreError = "pass"
	})
	h, _ := newTestHandler(t, nil)
	for _, c := range []struct {
		h    *Handler
		want string
	}{{hp, "unknown"}, {h, "<none>"}} {
		exp.Reset()
		ctx, span := tp.Tracer("test").Start(context.Background(), "handler")
		_, _, _ = serve(c.h, signedRequest(bodyA, "").WithContext(ctx), &countingNext{})
		span.End()
		got := "<none>"
		for _, kv := range exp.GetSpans()[0].Attributes {
			if kv.Key == "sangho_dedup.prior_attempt" {
				got = kv.Value.AsString()
			}
		}
		if got != c.want {
			t.Errorf("span attribute sangho_dedup.prior_attempt = %q, want %q", got, c.want)
		}
	}
}

// TestMalformedTakeoverKeepsTheMark: a malformed body whose claim took
// over an earlier attempt's lapsed lease (fate unknown) is 400 and keeps
// that lease until lock_ttl: the well-formed retry after it still
// reaches the backend marked. Released instead, the retry would go on
// unmarked.
func TestMalformedTakeoverKeepsTheMark(t *testing.T) {
	h, marked := redisHandler(t, 300*time.Millisecond)
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(504, errors.New("net/http: timeout awaiting response headers"))
	})
	good := `{"id":"evt_lapsed","type":"x"}`
	if _, repl, _ := serve(h, signedRequest(good, ""), held); outcomeOf(repl) != outcomeHeld {
		t.Fatalf("first attempt: %q; want held", outcomeOf(repl))
	}
	time.Sleep(400 * time.Millisecond)
	w, repl, _ := serve(h, signedRequest(`{"id":"evt_lapsed","type":"x","a":[}`, ""), &countingNext{})
	if w.Code != http.StatusBadRequest || outcomeOf(repl) != outcomeBadRequest {
		t.Fatalf("malformed takeover: %d %q; want 400", w.Code, outcomeOf(repl))
	}
	time.Sleep(400 * time.Millisecond)
	var prior []string
	next := priorAttemptBackend(&prior)
	w, repl, _ = serve(h, signedRequest(good, ""), next)
	if w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked || len(prior) != 1 || prior[0] != "unknown" {
		t.Fatalf("retry: %d %q, prior attempt %q; want 200 processed_marked unknown", w.Code, outcomeOf(repl), prior)
	}
	if got := marked(); len(got) != 1 || got[0] != "evt_lapsed" {
		t.Fatalf("marked lines %v; want one for evt_lapsed", got)
	}
}
