package sanghodedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// testNow is the clock of the handler tests: the time of the contract's
// vectors, so that they verify as they are.
var testNow = time.Unix(1733140800, 0)

// testClock reads testNow. A test sets a handler's clock (the unexported
// field now) before Provision, which hands it to the signature scheme.
func testClock() time.Time { return testNow }

// newTestHandler provisions a handler (memory store unless changed) with
// a fixed clock and a log observer.
func newTestHandler(t testing.TB, configure func(*Handler)) (*Handler, *observer.ObservedLogs) {
	t.Helper()
	h := &Handler{Secrets: []string{secret1}, StoreRaw: json.RawMessage(`{"type":"memory"}`), now: testClock}
	if configure != nil {
		configure(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core)
	return h, logs
}

// signedRequest builds a signed request the way Sangho sends one.
func signedRequest(body, id string, secrets ...string) *http.Request {
	if len(secrets) == 0 {
		secrets = []string{secret1}
	}
	r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if id != "" {
		r.Header.Set("Sangho-Event-ID", id)
	}
	r.Header.Set("Sangho-Signature", sangho.Sign(testNow, []byte(body), secrets...))
	return r
}

func eventBody(id string) string {
	return `{"id":"` + id + `","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":2000}}}`
}

// countingNext is a next handler that records what reaches it.
type countingNext struct {
	mu     sync.Mutex
	bodies []string
	calls  atomic.Int32
	serve  func(w http.ResponseWriter, r *http.Request) error
}

func (n *countingNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	n.calls.Add(1)
	b, _ := io.ReadAll(r.Body)
	n.mu.Lock()
	n.bodies = append(n.bodies, string(b))
	n.mu.Unlock()
	if n.serve != nil {
		return n.serve(w, r)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// serve runs the handler like Caddy does: with a replacer in the
// context, and a HandlerError turned into its status.
func serve(h *Handler, r *http.Request, next caddyhttp.Handler) (*httptest.ResponseRecorder, *caddy.Replacer, error) {
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, r, next)
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		w.WriteHeader(he.StatusCode)
	}
	return w, repl, err
}

func outcomeOf(repl *caddy.Replacer) string {
	v, _ := repl.GetString("http.sangho_dedup.outcome")
	return v
}

func TestHandlerStatusTable(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.MaxBodySize = 1024 })
	stale := signedRequest(eventBody("evt_stale"), "")
	stale.Header.Set("Sangho-Signature", sangho.Sign(testNow.Add(-10*time.Minute), []byte(eventBody("evt_stale")), secret1))
	get := signedRequest(eventBody("evt_get"), "")
	get.Method = http.MethodGet
	twoSigs := signedRequest(eventBody("evt_2sig"), "")
	twoSigs.Header.Add("Sangho-Signature", sangho.Sign(testNow, []byte(eventBody("evt_2sig")), secret1))
	noSig := signedRequest(eventBody("evt_nosig"), "")
	noSig.Header.Del("Sangho-Signature")
	bigBody := `{"id":"evt_big","pad":"` + strings.Repeat("x", 1100) + `"}`
	declaredBig := signedRequest(bigBody, "")
	chunkedBig := signedRequest(bigBody, "")
	chunkedBig.ContentLength = -1 // as a chunked request arrives: size unknown
	truncated := signedRequest(eventBody("evt_trunc"), "")
	truncated.Body = io.NopCloser(iotest.TimeoutReader(strings.NewReader(eventBody("evt_trunc")))) // fails on its 2nd read
	truncated.ContentLength = -1

	cases := []struct {
		name    string
		req     *http.Request
		status  int
		outcome string
		header  [2]string
	}{
		{"GET", get, 405, outcomeBadRequest, [2]string{"Allow", "POST"}},
		{"declared body over max_body_size", declaredBig, 413, outcomeTooLarge, [2]string{}},
		{"chunked body over max_body_size", chunkedBig, 413, outcomeTooLarge, [2]string{}},
		{"body cut short", truncated, 400, outcomeBadRequest, [2]string{}},
		{"no signature", noSig, 401, outcomeInvalidSignature, [2]string{}},
		{"signed with another secret", signedRequest(eventBody("evt_other"), "", secret2), 401, outcomeInvalidSignature, [2]string{}},
		{"signature 10 minutes old", stale, 401, outcomeInvalidSignature, [2]string{}},
		{"two signature headers", twoSigs, 401, outcomeInvalidSignature, [2]string{}},
		{"no event ID", signedRequest(`{"type":"x"}`, ""), 400, outcomeBadRequest, [2]string{}},
		{"bad event ID", signedRequest(eventBody("evt.1"), ""), 400, outcomeBadRequest, [2]string{}},
		{"header and body IDs differ", signedRequest(eventBody("evt_a"), "evt_b"), 400, outcomeBadRequest, [2]string{}},
		{"new event", signedRequest(eventBody("evt_new"), "evt_new"), 200, outcomeProcessed, [2]string{}},
		{"same event again", signedRequest(eventBody("evt_new"), "evt_new"), 200, outcomeDuplicate, [2]string{"Sangho-Dedup", "duplicate"}},
	}
	next := &countingNext{}
	for _, c := range cases {
		before := next.calls.Load()
		w, repl, _ := serve(h, c.req, next)
		if w.Code != c.status {
			t.Errorf("%s: status %d, want %d", c.name, w.Code, c.status)
		}
		if got := outcomeOf(repl); got != c.outcome {
			t.Errorf("%s: outcome %q, want %q", c.name, got, c.outcome)
		}
		if c.header[0] != "" && w.Header().Get(c.header[0]) != c.header[1] {
			t.Errorf("%s: %s = %q, want %q", c.name, c.header[0], w.Header().Get(c.header[0]), c.header[1])
		}
		reached := next.calls.Load() - before
		if wantReach := int32(0); c.outcome == outcomeProcessed {
			wantReach = 1
			if reached != wantReach {
				t.Errorf("%s: reached the backend %d times, want 1", c.name, reached)
			}
		} else if reached != 0 {
			t.Errorf("%s: reached the backend", c.name)
		}
	}
	// Nothing but the processed event left a key behind.
	for _, id := range []string{"evt_get", "evt_big", "evt_trunc", "evt_nosig", "evt_other", "evt_stale", "evt_2sig", "evt_a", "evt_b"} {
		if res, _, err := h.store.Claim(context.Background(), h.KeyPrefix+id, "probe", time.Minute); err != nil || res != dedup.Claimed {
			t.Errorf("a rejected request left key %s behind (%v)", id, res)
		}
	}
}

// TestReplayThroughHeaderID: the event ID header is not signed. By
// default (require_body_id on) a signed body without a top-level "id" is
// refused, so a captured delivery cannot be replayed as a new event under
// another header ID. With require_body_id off, the signed message (t and
// body) is remembered with the ID it was first accepted with, and its
// reuse with another ID is refused with 401.
func TestReplayThroughHeaderID(t *testing.T) {
	body := `{"object":"event","type":"invoice.paid","data":{"amount":10}}`
	captured := signedRequest(body, "evt_first").Header.Get("Sangho-Signature")
	replay := func(id, sig string) *http.Request {
		r := signedRequest(body, id)
		r.Header.Set("Sangho-Signature", sig)
		return r
	}

	h, _ := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "replay_on:" })
	next := &countingNext{}
	for _, id := range []string{"evt_first", "evt_second", "evt_third"} {
		w, repl, err := serve(h, replay(id, captured), next)
		if w.Code != 400 || !errors.Is(err, errIDNotInBody) || outcomeOf(repl) != outcomeBadRequest {
			t.Errorf("require_body_id on (the default), header ID %s: %d %v, want 400 (no id in the body)", id, w.Code, err)
		}
	}
	if w, _, _ := serve(h, signedRequest(eventBody("evt_in_body"), "evt_in_body"), next); w.Code != 200 {
		t.Errorf("require_body_id on, a body with its id: %d", w.Code)
	}
	if n := next.calls.Load(); n != 1 {
		t.Errorf("require_body_id on: the backend was reached %d times, want 1", n)
	}

	off := false
	h, _ = newTestHandler(t, func(h *Handler) { h.RequireBodyID, h.KeyPrefix = &off, "replay_off:" })
	next = &countingNext{}
	for _, c := range []struct {
		id, sig string
		status  int
		outcome string
	}{
		{"evt_first", captured, 200, outcomeProcessed},
		// evt_first's signed bytes, processed: its duplicates.
		{"evt_second", captured, 200, outcomeDuplicate},
		{"evt_third", captured, 200, outcomeDuplicate},
		{"evt_first", captured, 200, outcomeDuplicate}, // the same delivery again: deduplicated
		// Signed afresh (another t), the same body is another message.
		{"evt_second", sangho.Sign(testNow.Add(time.Second), []byte(body), secret1), 200, outcomeProcessed},
	} {
		w, repl, err := serve(h, replay(c.id, c.sig), next)
		if w.Code != c.status || outcomeOf(repl) != c.outcome {
			t.Errorf("require_body_id off, header ID %s: %d %q (%v), want %d %q", c.id, w.Code, outcomeOf(repl), err, c.status, c.outcome)
		}
		if c.status == 401 && !errors.Is(err, errSigReplayed) {
			t.Errorf("require_body_id off, header ID %s: error %v, want errSigReplayed", c.id, err)
		}
	}
	if n := next.calls.Load(); n != 2 {
		t.Errorf("require_body_id off: the backend was reached %d times, want 2 (evt_first once, evt_second signed afresh)", n)
	}
}

func TestDuplicateAnswer(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	next := &countingNext{}
	serve(h, signedRequest(bodyA, ""), next)
	w, _, err := serve(h, signedRequest(bodyA, ""), next)
	if err != nil || w.Code != 200 || w.Body.String() != `{"received":true}` ||
		w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Sangho-Dedup") != "duplicate" {
		t.Fatalf("duplicate answer: %d %v %q %v", w.Code, err, w.Body.String(), w.Header())
	}
	if next.calls.Load() != 1 {
		t.Fatalf("backend reached %d times", next.calls.Load())
	}
}

func TestBackendAnswerPassesUntouched(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-App", "yes")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte("queued"))
		return nil
	})
	w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 202 || w.Body.String() != "queued" || w.Header().Get("X-App") != "yes" || w.Header().Get("Sangho-Dedup") != "" {
		t.Fatalf("answer changed: %d %q %v", w.Code, w.Body.String(), w.Header())
	}
	if outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("outcome %q", outcomeOf(repl))
	}
	id, _ := repl.GetString("http.sangho_dedup.event_id")
	typ, _ := repl.GetString("http.sangho_dedup.event_type")
	if id != "evt_1QZtest000000000001" || typ != "payment_intent.succeeded" {
		t.Fatalf("placeholders: %q %q", id, typ)
	}
}

// TestFailuresRelease: a backend that answers non-2xx, or is never
// reached, releases the event, so that Sangho's next attempt is processed.
func TestFailuresRelease(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter, r *http.Request) error{
		"500":          func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(500); return nil },
		"404":          func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(404); return nil },
		"302":          func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(302); return nil },
		"103 then 500": func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(103); w.WriteHeader(500); return nil },
		"dial error": func(w http.ResponseWriter, r *http.Request) error {
			return caddyhttp.Error(502, reverseproxy.NewDialError(errors.New("dial tcp 127.0.0.1:1: connect: connection refused")))
		},
		"no upstreams": func(w http.ResponseWriter, r *http.Request) error {
			return caddyhttp.Error(503, errors.New("no upstreams available"))
		},
	}
	for name, fail := range cases {
		t.Run(name, func(t *testing.T) {
			h, _ := newTestHandler(t, nil)
			attempt := 0
			next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
				attempt++
				if attempt == 1 {
					return fail(w, r)
				}
				w.WriteHeader(200)
				return nil
			}}
			_, repl, _ := serve(h, signedRequest(bodyA, ""), next)
			if outcomeOf(repl) != outcomeReleased {
				t.Fatalf("first attempt: outcome %q, want released", outcomeOf(repl))
			}
			w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
			if w.Code != 200 || outcomeOf(repl) != outcomeProcessed {
				t.Fatalf("retry: %d %q, want 200 processed", w.Code, outcomeOf(repl))
			}
			_, repl, _ = serve(h, signedRequest(bodyA, ""), next)
			if outcomeOf(repl) != outcomeDuplicate || next.calls.Load() != 2 {
				t.Fatalf("third attempt: %q, backend calls %d; want duplicate and 2", outcomeOf(repl), next.calls.Load())
			}
		})
	}
}

// TestUnknownFateHolds: when it is unknown whether the backend got the
// event (timeout, connection lost, client gone, panic), the lease is held
// until lock_ttl: a retry meanwhile gets 409, one after it is processed,
// passed on marked (Sangho-Dedup-Prior-Attempt: unknown), since the first
// attempt may have been done.
func TestUnknownFateHolds(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter, r *http.Request) error{
		"gateway timeout": func(w http.ResponseWriter, r *http.Request) error {
			return caddyhttp.Error(504, errors.New("net/http: timeout awaiting response headers"))
		},
		"connection reset": func(w http.ResponseWriter, r *http.Request) error {
			return caddyhttp.Error(502, errors.New("read tcp: connection reset by peer"))
		},
		"client gone": func(w http.ResponseWriter, r *http.Request) error { return caddyhttp.Error(499, context.Canceled) },
		"plain error": func(w http.ResponseWriter, r *http.Request) error { return errors.New("boom") },
		"panic":       func(w http.ResponseWriter, r *http.Request) error { panic("backend bug") },
	}
	for name, fail := range cases {
		t.Run(name, func(t *testing.T) {
			h, _ := newTestHandler(t, func(h *Handler) { h.LockTTL = caddy.Duration(300 * time.Millisecond) })
			func() {
				defer func() { _ = recover() }()
				_, repl, _ := serve(h, signedRequest(bodyA, ""), caddyhttp.HandlerFunc(fail))
				if outcomeOf(repl) != outcomeHeld {
					t.Errorf("outcome %q, want held", outcomeOf(repl))
				}
			}()
			var mark atomic.Value
			next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
				mark.Store(r.Header.Get("Sangho-Dedup-Prior-Attempt"))
				return nil
			}}
			if w, _, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 409 {
				t.Fatalf("retry within lock_ttl: %d, want 409", w.Code)
			}
			time.Sleep(350 * time.Millisecond)
			if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessedMarked {
				t.Fatalf("retry after lock_ttl: %d %q, want processed_marked", w.Code, outcomeOf(repl))
			}
			if m, _ := mark.Load().(string); m != "unknown" {
				t.Fatalf("retry after lock_ttl reached the backend with Sangho-Dedup-Prior-Attempt %q, want unknown", m)
			}
			if next.calls.Load() != 1 {
				t.Fatalf("backend calls %d", next.calls.Load())
			}
		})
	}
}

// TestCommitRetriedWhileLeaseLasts: Redis stalls (CLIENT PAUSE WRITE)
// just as the backend answers 2xx; the done record is written once Redis
// resumes, so the next redelivery is a duplicate.
func TestCommitRetriedWhileLeaseLasts(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	h, logs := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(5 * time.Second)
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"read_timeout":"150ms"}`)
	})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "1000", "WRITE").Err(); err != nil {
			t.Error(err)
		}
		w.WriteHeader(200)
		return nil
	})
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != 200 || outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%d %q", w.Code, outcomeOf(repl))
	}
	key := h.KeyPrefix + "evt_1QZtest000000000001"
	deadline := time.Now().Add(4 * time.Second)
	for !strings.HasPrefix(rc.Get(context.Background(), key).Val(), dedup.DonePrefix) {
		if time.Now().After(deadline) {
			t.Fatalf("the done record was not written within 4s: %q", rc.Get(context.Background(), key).Val())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The retry logs after its write lands: wait for the line too.
	for logs.FilterMessage("commit retried").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if logs.FilterMessage("commit retried").Len() != 1 {
		t.Fatal("the commit did not go through the retry path (did CLIENT PAUSE stall it?)")
	}
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); outcomeOf(repl) != outcomeDuplicate {
		t.Fatalf("after the retried commit: %q, want duplicate", outcomeOf(repl))
	}
}

// A 2xx status line is the verdict, even if the handler fails after it:
// the backend did the work, so it must not be done again.
func TestTwoHundredThenErrorCommits(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	serve(h, signedRequest(bodyA, ""), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(200)
		return errors.New("client went away while the body was copied")
	}))
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); outcomeOf(repl) != outcomeDuplicate {
		t.Fatalf("outcome %q, want duplicate", outcomeOf(repl))
	}
	// and a handler that writes nothing answers 200: processed too
	h2, _ := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "silent:" })
	serve(h2, signedRequest(bodyA, ""), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	if _, repl, _ := serve(h2, signedRequest(bodyA, ""), &countingNext{}); outcomeOf(repl) != outcomeDuplicate {
		t.Fatalf("silent handler: outcome %q, want duplicate", outcomeOf(repl))
	}
}

func TestInFlightAnswers409(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.RetryAfter = caddy.Duration(1500 * time.Millisecond) })
	entered, release := make(chan struct{}), make(chan struct{})
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(entered)
		<-release
		w.WriteHeader(200)
		return nil
	})
	done := make(chan struct{})
	go func() { serve(h, signedRequest(bodyA, ""), slow); close(done) }()
	<-entered
	next := &countingNext{}
	w, repl, err := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 409 || w.Header().Get("Retry-After") != "2" || outcomeOf(repl) != outcomeInFlight || next.calls.Load() != 0 {
		t.Fatalf("concurrent delivery: %d Retry-After %q outcome %q err %v", w.Code, w.Header().Get("Retry-After"), outcomeOf(repl), err)
	}
	close(release)
	<-done
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), next); outcomeOf(repl) != outcomeDuplicate {
		t.Fatalf("after the first finished: %q", outcomeOf(repl))
	}
}

func TestStoreErrorRejectOrPass(t *testing.T) {
	srv := startRedis(t)
	srv.Kill()
	redisDown := func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"dial_timeout":"100ms"}`)
	}
	h, _ := newTestHandler(t, redisDown)
	next := &countingNext{}
	w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 503 || w.Header().Get("Retry-After") != "10" || outcomeOf(repl) != outcomeStoreError || next.calls.Load() != 0 {
		t.Fatalf("reject: %d %q %q calls %d", w.Code, w.Header().Get("Retry-After"), outcomeOf(repl), next.calls.Load())
	}
	hp, _ := newTestHandler(t, func(h *Handler) { redisDown(h); h.OnStoreError = "pass" })
	before := testutil.ToFloat64(hp.outcomes[outcomeUnchecked])
	w, repl, _ = serve(hp, signedRequest(bodyA, ""), next)
	if w.Code != 200 || outcomeOf(repl) != outcomeUnchecked || next.calls.Load() != 1 {
		t.Fatalf("pass: %d %q calls %d", w.Code, outcomeOf(repl), next.calls.Load())
	}
	if d := testutil.ToFloat64(hp.outcomes[outcomeUnchecked]) - before; d != 1 {
		t.Fatalf("unchecked counter moved by %v", d)
	}
}

func TestMetricsCountOutcomes(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "metrics:" })
	read := func() map[string]float64 {
		m := map[string]float64{}
		for _, o := range allOutcomes {
			// The endpoint label is the handler's name, its key_prefix without the colon by default.
			m[o] = testutil.ToFloat64(metrics.events.WithLabelValues("metrics", o))
		}
		for _, r := range sigReasons {
			m["signature "+r] = testutil.ToFloat64(metrics.sigReason[r])
		}
		return m
	}
	before := read()
	serve(h, signedRequest(bodyA, ""), &countingNext{})
	serve(h, signedRequest(bodyA, ""), &countingNext{})
	serve(h, signedRequest(bodyA, "", secret2), &countingNext{})
	noSig := signedRequest(bodyA, "")
	noSig.Header.Del("Sangho-Signature")
	serve(h, noSig, &countingNext{})
	after := read()
	for o, want := range map[string]float64{outcomeProcessed: 1, outcomeDuplicate: 1, outcomeInvalidSignature: 2,
		"signature mismatch": 1, "signature missing": 1, "signature other": 0} {
		if got := after[o] - before[o]; got != want {
			t.Errorf("%s moved by %v, want %v", o, got, want)
		}
	}
	if n := testutil.CollectAndCount(metrics.storeOps); n == 0 {
		t.Error("no store latency observed")
	}
}

// TestNoSecretInLogsOrErrors runs every kind of rejection with debug
// logging on and looks for the secret and the signatures.
func TestNoSecretInLogsOrErrors(t *testing.T) {
	h, logs := newTestHandler(t, nil)
	good := signedRequest(bodyA, "")
	sig := good.Header.Get("Sangho-Signature")
	reqs := []*http.Request{good, signedRequest(bodyA, ""), signedRequest(bodyA, "", secret2), signedRequest(bodyA, "evt_x"), signedRequest(`{}`, "")}
	var errs []string
	for _, r := range reqs {
		_, _, err := serve(h, r, &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(500); return nil }})
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	var all bytes.Buffer
	for _, e := range logs.All() {
		all.WriteString(e.Message)
		for k, v := range e.ContextMap() {
			all.WriteString(k)
			all.WriteString(strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " ")))
		}
	}
	all.WriteString(strings.Join(errs, "\n"))
	if logs.Len() == 0 {
		t.Fatal("nothing was logged")
	}
	for _, bad := range []string{secret1, secret2, sig[13:40], vectors[0].V1[:20]} {
		if strings.Contains(all.String(), bad) {
			t.Fatalf("logs or errors contain %q:\n%s", bad, all.String())
		}
	}
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case error:
		return x.Error()
	}
	return ""
}

// TestPayloadMismatch: an event processed with one body and delivered
// again with another is not a duplicate: 422 (reject, the default) or
// 200 duplicate and a warning (log); never the backend. The same body
// is a duplicate, and a record written before fingerprints existed too.
func TestPayloadMismatch(t *testing.T) {
	first := `{"id":"evt_fp","type":"charge.succeeded","data":{"amount":1}}`
	changed := `{"id":"evt_fp","type":"charge.succeeded","data":{"amount":2}}`
	for _, mode := range []string{"", "reject", "log"} {
		t.Run("mode "+mode, func(t *testing.T) {
			h, logs := newTestHandler(t, func(h *Handler) { h.OnPayloadMismatch = mode })
			next := &countingNext{}
			if w, _, _ := serve(h, signedRequest(first, ""), next); w.Code != 200 {
				t.Fatalf("first delivery: %d", w.Code)
			}
			if w, repl, _ := serve(h, signedRequest(first, ""), next); w.Code != 200 || w.Header().Get("Sangho-Dedup") != "duplicate" || outcomeOf(repl) != outcomeDuplicate {
				t.Fatalf("same body again: %d %q %s", w.Code, w.Header().Get("Sangho-Dedup"), outcomeOf(repl))
			}
			w, repl, _ := serve(h, signedRequest(changed, ""), next)
			if outcomeOf(repl) != outcomePayloadMismatch {
				t.Errorf("outcome %q, want payload_mismatch", outcomeOf(repl))
			}
			if mode == "log" {
				if w.Code != 200 || w.Header().Get("Sangho-Dedup") != "duplicate" {
					t.Errorf("log mode: %d %q, want 200 duplicate", w.Code, w.Header().Get("Sangho-Dedup"))
				}
			} else if w.Code != http.StatusUnprocessableEntity || w.Header().Get("Sangho-Dedup") != "payload_mismatch" {
				t.Errorf("reject mode: %d %q, want 422 payload_mismatch", w.Code, w.Header().Get("Sangho-Dedup"))
			}
			if n := next.calls.Load(); n != 1 {
				t.Errorf("the backend was reached %d times, want once", n)
			}
			if logs.FilterMessage("payload mismatch").FilterField(zap.String("state", "done")).Len() != 1 {
				t.Errorf("no warning logged: %v", logs.All())
			}
		})
	}
	t.Run("records without a fingerprint stay duplicates", func(t *testing.T) {
		h, _ := newTestHandler(t, nil)
		old := dedup.DoneRecord{ProcessedAt: testNow, EventType: "charge.succeeded"} // written before fingerprints
		if _, err := h.store.Commit(context.Background(), h.KeyPrefix+"evt_old", "t", old, time.Hour); err != nil {
			t.Fatal(err)
		}
		next := &countingNext{}
		w, repl, _ := serve(h, signedRequest(eventBody("evt_old"), ""), next)
		if w.Code != 200 || outcomeOf(repl) != outcomeDuplicate || next.calls.Load() != 0 {
			t.Fatalf("redelivery of an old record: %d %s, backend %d", w.Code, outcomeOf(repl), next.calls.Load())
		}
	})
	t.Run("in flight with another body: 409, logged", func(t *testing.T) {
		h, logs := newTestHandler(t, nil)
		release := make(chan struct{})
		slow := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
			<-release
			w.WriteHeader(200)
			return nil
		}}
		done := make(chan struct{})
		go func() { serve(h, signedRequest(first, ""), slow); close(done) }()
		for slow.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		w, _, _ := serve(h, signedRequest(changed, ""), &countingNext{})
		close(release)
		<-done
		if w.Code != http.StatusConflict {
			t.Fatalf("in flight with another body: %d, want 409", w.Code)
		}
		if logs.FilterMessage("payload mismatch").FilterField(zap.String("state", "in_flight")).Len() != 1 {
			t.Errorf("no warning logged")
		}
	})
	t.Run("the done record keeps the fingerprint", func(t *testing.T) {
		h, _ := newTestHandler(t, nil)
		serve(h, signedRequest(first, ""), &countingNext{})
		e, err := h.store.Get(context.Background(), h.KeyPrefix+"evt_fp")
		if err != nil {
			t.Fatal(err)
		}
		if rec, _ := dedup.DecodeDone(e.Value); rec.Fingerprint != wantXXH64Fingerprint(first) {
			t.Fatalf("record %q: fingerprint %q, want x and the body's xxh64", e.Value, rec.Fingerprint)
		}
	})
}

// TestCommitRetriesAtExit: at process exit, background commit retries
// get a bounded grace to land; one that lands is not counted, one still
// failing when the grace ends is abandoned, logged and counted in
// caddy_sangho_dedup_commit_errors_total.
func TestCommitRetriesAtExit(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	h, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"read_timeout":"100ms","dial_timeout":"100ms"}`)
	})
	stall := func(ms string) caddyhttp.Handler {
		return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if err := rc.Do(context.Background(), "CLIENT", "PAUSE", ms, "WRITE").Err(); err != nil {
				t.Error(err)
			}
			w.WriteHeader(200)
			return nil
		})
	}
	defer func(g time.Duration) { exitCommitGrace = g }(exitCommitGrace)
	exitCommitGrace = 2 * time.Second

	// Redis stalls for 600 ms: the retry lands within the grace.
	before := testutil.ToFloat64(metrics.commitErr)
	serve(h, signedRequest(eventBody("evt_exit_1"), ""), stall("600"))
	if pendingCommits.Load() == 0 {
		t.Fatal("the commit did not go to the background retries")
	}
	drainCommitRetries(context.Background())
	if n := pendingCommits.Load(); n != 0 || testutil.ToFloat64(metrics.commitErr) != before {
		t.Fatalf("a retry that could land within the grace: %d pending, %v counted", n, testutil.ToFloat64(metrics.commitErr)-before)
	}
	if !strings.HasPrefix(rc.Get(context.Background(), h.KeyPrefix+"evt_exit_1").Val(), dedup.DonePrefix) {
		t.Fatal("the done record did not land within the grace")
	}

	// Redis stalls for 5 s: longer than the grace.
	serve(h, signedRequest(eventBody("evt_exit_2"), ""), stall("5000"))
	start := time.Now()
	drainCommitRetries(context.Background())
	if d := time.Since(start); d < exitCommitGrace || d > exitCommitGrace+2*time.Second {
		t.Errorf("the drain took %v, want about the grace, %v", d, exitCommitGrace)
	}
	if got := testutil.ToFloat64(metrics.commitErr) - before; got != 1 {
		t.Fatalf("abandoned retries counted: %v, want 1", got)
	}
	_ = rc.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
}

// TestAbandonedCommitRetriesLoggedByTheHandler: the exit hook's
// "commit retries abandoned at exit" comes out through the logger of the
// handler whose retries it abandons (http.handlers.sangho_dedup, with
// that handler's sinks), like every other line of the handler. (Found by
// review: it went to caddy.Log().) The store that does not answer is
// Redis with its writes paused.
func TestAbandonedCommitRetriesLoggedByTheHandler(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	defer func(g time.Duration) { exitCommitGrace = g }(exitCommitGrace)
	exitCommitGrace = 300 * time.Millisecond
	h, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"read_timeout":"100ms","dial_timeout":"100ms","local_cache":0}`)
	})
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core).Named("http.handlers.sangho_dedup")
	pause := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
			t.Error(err)
		}
		w.WriteHeader(200)
		return nil
	})
	defer rc.Do(context.Background(), "CLIENT", "UNPAUSE")
	if w, _, _ := serve(h, signedRequest(bodyA, ""), pause); w.Code != 200 {
		t.Fatalf("delivery: %d", w.Code)
	}
	mine := func() int64 { return pendingCommits.byLogger()[h.logger] } // not an earlier test's
	if mine() == 0 {
		t.Fatal("the commit did not go to the background retries")
	}
	go func() {
		// Once the retries are abandoned, Redis comes back: the retry
		// lands and ends.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if logs.FilterMessage("commit retries abandoned at exit").Len() > 0 {
				break
			}
		}
		_ = rc.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
	}()
	drainCommitRetries(context.Background())
	waitFor(t, "the commit retry to end", func() bool { return mine() == 0 })
	lines := logs.FilterMessage("commit retries abandoned at exit").All()
	if len(lines) != 1 || lines[0].LoggerName != "http.handlers.sangho_dedup" || lines[0].Level != zapcore.ErrorLevel {
		t.Fatalf("abandoned retries logged through the handler's logger: %+v", lines)
	}
	if f := lines[0].ContextMap(); f["events"] != int64(1) {
		t.Fatalf("fields %v, want events 1", f)
	}
}

// TestRejectionLogsRemoteAddress: a rejection's debug line names the
// client as Caddy's access log does, remote_ip (the address alone) and
// remote_port, so that it can be matched with the access log and with
// Caddy's remote_ip matcher.
func TestRejectionLogsRemoteAddress(t *testing.T) {
	h, logs := newTestHandler(t, nil)
	for remote, want := range map[string][2]string{
		"192.0.2.1:1234":    {"192.0.2.1", "1234"},
		"[2001:db8::1]:443": {"2001:db8::1", "443"},
		"@":                 {"@", ""}, // a Unix socket: no port to split off
	} {
		r := signedRequest(bodyA, "", secret2) // a wrong secret: 401
		r.RemoteAddr = remote
		serve(h, r, &countingNext{})
		var e []observer.LoggedEntry
		for _, l := range logs.TakeAll() {
			if l.Message == "delivery rejected" {
				e = append(e, l)
			}
		}
		if len(e) != 1 {
			t.Fatalf("%s: %d rejection lines", remote, len(e))
		}
		f := e[0].ContextMap()
		if f["remote_ip"] != want[0] || want[1] != "" && f["remote_port"] != want[1] {
			t.Errorf("%s: remote_ip %q, remote_port %q; want %q, %q", remote, f["remote_ip"], f["remote_port"], want[0], want[1])
		}
	}
}

// redisUserLosingSet starts Redis with a user app (password pw) that may
// run every command, and returns its address, an admin client, a
// backend that takes SET away from app as it answers 200 (so the commit
// after it fails, and is retried), and allowSet, which gives SET back.
func redisUserLosingSet(t *testing.T) (addr string, admin *redis.Client, loseSet caddyhttp.Handler, allowSet func()) {
	t.Helper()
	srv := startRedis(t)
	admin = srv.Client(t)
	acl := func(rules ...any) {
		t.Helper()
		if err := admin.Do(context.Background(), append([]any{"ACL", "SETUSER", "app"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acl("on", ">pw", "~*", "+@all")
	loseSet = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		acl("-set")
		w.WriteHeader(200)
		return nil
	})
	return srv.Addr, admin, loseSet, func() { acl("+set") }
}

// TestForgetStopsCommitRetries: an operator forgets an event whose
// commit failed and is being retried in the background (here: the Redis
// user lost SET just as the backend answered). Forced, the forget
// deletes the lease and stops the retry, which would otherwise write the
// record back once SET is allowed again and turn the next delivery into
// a duplicate. Not forced, the forget is refused (in flight) and the
// retry goes on and lands. (Found by review.)
func TestForgetStopsCommitRetries(t *testing.T) {
	ctx := context.Background()
	addr, admin, loseSet, allowSet := redisUserLosingSet(t)
	h, logs := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(10 * time.Second)
		h.StoreRaw = []byte(`{"type":"redis","address":["` + addr + `"],"username":"app","password":"pw"}`)
	})
	retrying := func(key string) bool {
		return commitRetries.pending(h.storeData, key)
	}
	for _, force := range []bool{false, true} {
		id := "evt_retry_forced_" + map[bool]string{false: "no", true: "yes"}[force]
		key := h.KeyPrefix + id
		if _, repl, _ := serve(h, signedRequest(eventBody(id), ""), loseSet); outcomeOf(repl) != outcomeProcessed {
			t.Fatalf("%s: %q, want processed", id, outcomeOf(repl))
		}
		if !retrying(key) {
			t.Fatalf("%s: the commit is not being retried", id)
		}
		e, deleted, err := h.forget(ctx, key, force)
		if err != nil || deleted != force || !strings.HasPrefix(e.Value, dedup.InFlightPrefix) {
			t.Fatalf("%s: forget (force %v): %q %v %v", id, force, e.Value, deleted, err)
		}
		allowSet()
		waitFor(t, "the retry of "+id+" to end", func() bool { return !retrying(key) })
		v := admin.Get(ctx, key).Val()
		if !force {
			if !strings.HasPrefix(v, dedup.DonePrefix) {
				t.Fatalf("%s: a forget refused stopped the retry: %q, want the done record", id, v)
			}
			continue
		}
		if v != "" {
			t.Fatalf("%s: the retry wrote %q back after the forget", id, v)
		}
		if logs.FilterMessage("commit stopped").Len() != 1 {
			t.Error(`no "commit stopped" log line`)
		}
		if _, repl, _ := serve(h, signedRequest(eventBody(id), ""), &countingNext{}); outcomeOf(repl) != outcomeProcessed {
			t.Fatalf("%s: the delivery after the forget: %q, want processed", id, outcomeOf(repl))
		}
	}
}

// slowFailingCommit blocks the first Commit until released, then fails it
// (a commit timing out at read_timeout); later Commits go through.
type slowFailingCommit struct {
	dedup.Store
	entered, release chan struct{}
	calls            int
}

func (s *slowFailingCommit) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	s.calls++
	if s.calls == 1 {
		close(s.entered)
		<-s.release
		return false, errors.New("i/o timeout")
	}
	return s.Store.Commit(ctx, key, token, rec, retention)
}

// TestForgetDuringTheFirstCommit: a forced forget that comes while the
// commit after the backend's 2xx is still under way (and about to fail)
// waits for it, and then stops the retry that follows; otherwise the
// retry would write the forgotten record back. The store is the memory
// store with its first commit held and failed (fault injection).
// (Found by review.)
func TestForgetDuringTheFirstCommit(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	st := &slowFailingCommit{Store: h.store, entered: make(chan struct{}), release: make(chan struct{})}
	h.store = st
	id := "evt_review_window"
	key := h.KeyPrefix + id
	ok := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(200); return nil })
	done := make(chan struct{})
	go func() { defer close(done); serve(h, signedRequest(eventBody(id), ""), ok) }()
	<-st.entered
	type forgot struct {
		e       dedup.Entry
		deleted bool
		err     error
	}
	fc := make(chan forgot, 1)
	go func() {
		e, deleted, err := h.forget(context.Background(), key, true)
		fc <- forgot{e, deleted, err}
	}()
	time.Sleep(50 * time.Millisecond) // the forget is on its way
	close(st.release)                 // the first commit fails
	<-done
	if f := <-fc; f.err != nil || !f.deleted || !strings.HasPrefix(f.e.Value, dedup.InFlightPrefix) {
		t.Fatalf("forget: %q %v %v", f.e.Value, f.deleted, f.err)
	}
	waitFor(t, "the retry to end", func() bool {
		return !commitRetries.pending(h.storeData, key)
	})
	if got, _ := h.store.Get(context.Background(), key); got.Value != "" {
		t.Fatalf("the retry wrote %q back after the operator's forget answered 200: the next delivery is answered duplicate", got.Value)
	}
}

// TestForgetAcrossAReloadThatSpellsRedisAnew: a reload that spells the
// same Redis differently (address, then url) is the same store state:
// the new config's forget stops the old config's commit retry, which
// would write the record back. (Found by review.)
func TestForgetAcrossAReloadThatSpellsRedisAnew(t *testing.T) {
	ctx := context.Background()
	addr, admin, loseSet, allowSet := redisUserLosingSet(t)
	old, _ := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(10 * time.Second)
		h.StoreRaw = []byte(`{"type":"redis","address":["` + addr + `"],"username":"app","password":"pw"}`)
	})
	cur, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","url":"redis://app:pw@` + addr + `"}`)
	})
	if old.storeData != cur.storeData {
		t.Errorf("one Redis, two store IDs: %q and %q", old.storeData, cur.storeData)
	}
	id := "evt_review_reload"
	key := old.KeyPrefix + id
	if _, repl, _ := serve(old, signedRequest(eventBody(id), ""), loseSet); outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("%q, want processed", outcomeOf(repl))
	}
	if _, deleted, err := cur.forget(ctx, key, true); err != nil || !deleted {
		t.Fatalf("forget: %v %v", deleted, err)
	}
	allowSet()
	waitFor(t, "the retry to end", func() bool {
		return !commitRetries.pending(old.storeData, key)
	})
	if v := admin.Get(ctx, key).Val(); v != "" {
		t.Fatalf("the old config's retry wrote %q back after the new config's forget", v)
	}
}

// TestCommitRegistry: several commits of one key (a lease that expired
// and was claimed again) are each registered and removed on their own;
// a hold that stops them stops each of them, and not those of another
// key or store state.
func TestCommitRegistry(t *testing.T) {
	r := retryRegistry{m: map[retryKey]*commitRetry{}}
	a, b, c := r.add("s", "k"), r.add("s", "k"), r.add("s", "k")
	other, elsewhere := r.add("s", "k2"), r.add("s2", "k")
	r.remove(b) // from the middle of the chain
	release := r.hold([]string{"s"}, "k")
	release(true)
	for _, cr := range []*commitRetry{a, c} {
		if stopped, _ := cr.attempt(func() error { return nil }); !stopped {
			t.Error("a commit of the forgotten key was not stopped")
		}
	}
	for _, cr := range []*commitRetry{b, other, elsewhere} {
		if stopped, _ := cr.attempt(func() error { return nil }); stopped {
			t.Error("a commit not held by the forget was stopped")
		}
	}
	r.remove(c) // the head
	r.remove(a)
	if r.pending("s", "k") || !r.pending("s", "k2") || !r.pending("s2", "k") {
		t.Fatalf("pending after removals: %v %v %v", r.pending("s", "k"), r.pending("s", "k2"), r.pending("s2", "k"))
	}
	r.remove(other)
	r.remove(elsewhere)
	if len(r.m) != 0 {
		t.Fatalf("%d keys left in the registry", len(r.m))
	}
}

// A body is read up to its event ID before the claim, the rest only
// when the delivery is not a duplicate of the same body done before.

// TestMalformedAfterTheIDIsRefusedAndReleased: a body malformed after
// its ID (or holding a second top-level "id" there) is 400 and reaches
// nothing, as if read whole before the claim; the lease its claim took
// is released, so the well-formed delivery of that ID that follows is
// processed at once (not 409), and processed once. The 400's log line
// names the ID it claimed.
func TestMalformedAfterTheIDIsRefusedAndReleased(t *testing.T) {
	for name, bad := range map[string]string{
		"malformed":    `{"id":"evt_tail","type":"x","data":{"a":nul}}`,
		"second id":    `{"id":"evt_tail","type":"x","id":"evt_other"}`,
		"id in a case": `{"id":"evt_tail","type":"x","ID":"evt_other"}`,
		"trailing":     `{"id":"evt_tail","type":"x"} {}`,
		"cut after id": `{"id":"evt_tail"`,
		"cut, spaces":  "{\"id\":\"evt_tail\"  \n",
		"type, cut":    `{"type":"x","id":"evt_tail"`,
	} {
		t.Run(name, func(t *testing.T) {
			h, logs := newTestHandler(t, nil)
			next := &countingNext{}
			w, repl, _ := serve(h, signedRequest(bad, ""), next)
			if w.Code != http.StatusBadRequest || outcomeOf(repl) != outcomeBadRequest || next.calls.Load() != 0 {
				t.Fatalf("%s: %d %q, %d at the backend; want 400 bad_request, none", bad, w.Code, outcomeOf(repl), next.calls.Load())
			}
			if l := logs.FilterMessage("delivery rejected").All(); len(l) != 1 || l[0].ContextMap()["event_id"] != "evt_tail" {
				t.Fatalf("rejection lines %v; want one naming evt_tail, the ID claimed", l)
			}
			if e, err := h.store.Get(context.Background(), h.KeyPrefix+"evt_tail"); err != nil || e.State() != "absent" {
				t.Fatalf("the key after the 400: %+v, %v; want nothing (the lease released)", e, err)
			}
			good := `{"id":"evt_tail","type":"x"}`
			for i, want := range []string{outcomeProcessed, outcomeDuplicate} {
				w, repl, _ = serve(h, signedRequest(good, ""), next)
				if w.Code != 200 || outcomeOf(repl) != want {
					t.Fatalf("well-formed delivery %d: %d %q; want 200 %s", i+1, w.Code, outcomeOf(repl), want)
				}
			}
			if next.calls.Load() != 1 {
				t.Fatalf("backend called %d times; want 1", next.calls.Load())
			}
		})
	}
}

// TestDuplicateOfTheSameBodyKeepsItsType: a duplicate of an event done
// with the same body is answered from its ID alone, the body's "type"
// (after the ID) unread; the placeholder and the debug line still give
// it, from the done record.
func TestDuplicateOfTheSameBodyKeepsItsType(t *testing.T) {
	h, logs := newTestHandler(t, nil)
	body := `{"id":"evt_typed","data":{"n":[1,2,{"k":"v"}]},"type":"invoice.paid"}`
	for i, want := range []string{outcomeProcessed, outcomeDuplicate} {
		w, repl, _ := serve(h, signedRequest(body, ""), &countingNext{})
		typ, _ := repl.GetString("http.sangho_dedup.event_type")
		if w.Code != 200 || outcomeOf(repl) != want || typ != "invoice.paid" {
			t.Fatalf("delivery %d: %d %q, event_type %q; want 200 %s invoice.paid", i+1, w.Code, outcomeOf(repl), typ, want)
		}
	}
	lines := logs.FilterMessage("duplicate answered").All()
	if len(lines) != 1 || lines[0].ContextMap()["event_type"] != "invoice.paid" {
		t.Fatalf("debug lines %v; want one with event_type invoice.paid", lines)
	}
}

// TestAnotherBodyUnderADoneIDIsReadWhole: a malformed body under the ID
// of an event done with another body is 400, as before the claim (not
// 422 nor a duplicate): only the very body done is answered unread.
func TestAnotherBodyUnderADoneIDIsReadWhole(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	if w, _, _ := serve(h, signedRequest(`{"id":"evt_done","type":"x"}`, ""), &countingNext{}); w.Code != 200 {
		t.Fatalf("first delivery: %d", w.Code)
	}
	w, repl, _ := serve(h, signedRequest(`{"id":"evt_done","type":"x","a":tru}`, ""), &countingNext{})
	if w.Code != http.StatusBadRequest || outcomeOf(repl) != outcomeBadRequest {
		t.Fatalf("malformed body under a done ID: %d %q; want 400 bad_request", w.Code, outcomeOf(repl))
	}
}
