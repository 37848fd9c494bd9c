package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// callAdmin sends one request to the admin API's handler, as Caddy's
// admin server would, and returns the status and the decoded answer (an
// API error as {"error": ...}).
func callAdmin(t *testing.T, a *AdminAPI, method, target string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := a.serve(rec, httptest.NewRequest(method, target, nil)); err != nil {
		var ae caddy.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%s %s: not an API error: %v", method, target, err)
		}
		return ae.HTTPStatus, map[string]any{"error": ae.Message}
	}
	var v map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &v)
	return rec.Code, v
}

// failingStore is a store that is down (Redis or PostgreSQL unreachable).
type failingStore struct{ dedup.Store }

var errStoreDown = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused")

func (failingStore) Get(context.Context, string) (dedup.Entry, error) {
	return dedup.Entry{}, errStoreDown
}

func (failingStore) Forget(context.Context, string, bool) (dedup.Entry, bool, error) {
	return dedup.Entry{}, false, errStoreDown
}

// TestAdminStoreDownIsNotAbsent: a store that fails is 503 with its
// error, on a look-up and on a forget, never 404 "absent", which says
// the event was never processed (the CLI exits 1 on a 404: a script
// would redeliver a processed event).
func TestAdminStoreDownIsNotAbsent(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	h.store = failingStore{h.store}
	a := &AdminAPI{logger: zap.NewNop()}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		status, v := callAdmin(t, a, method, "/sangho_dedup/"+h.Name+"/events/evt_down")
		if status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(v["error"]), "connection refused") || v["state"] != nil {
			t.Errorf("%s with the store down: %d %v; want 503 with the store's error, no state", method, status, v)
		}
	}
}

// TestAdminForgetRefusalsAndAudit: force is ?force=true only; a mark is
// refused without it (409, fate unknown) and removed with it; the audit
// line of a forced forget says what was removed and that it was forced;
// only GET lists, only GET and DELETE reach an event, and a route is
// exactly /sangho_dedup/<name>/events/<id>. On the memory store, so
// that it runs with -short.
func TestAdminForgetRefusalsAndAudit(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	core, logs := observer.New(zapcore.InfoLevel)
	a := &AdminAPI{logger: zap.New(core)}
	ctx := context.Background()
	path := "/sangho_dedup/" + h.Name + "/events/"

	// an event in flight: ?force=<anything but true> is no force
	if res, _, err := h.store.Claim(ctx, h.KeyPrefix+"evt_busy", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	for _, q := range []string{"", "?force=false", "?force=0", "?force="} {
		if status, v := callAdmin(t, a, http.MethodDelete, path+"evt_busy"+q); status != http.StatusConflict || !strings.Contains(fmt.Sprint(v["error"]), "in flight") {
			t.Errorf("DELETE in flight%s: %d %v; want 409 in flight", q, status, v)
		}
	}
	// methods other than GET and DELETE change nothing
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch} {
		if status, _ := callAdmin(t, a, m, path+"evt_busy"); status != http.StatusMethodNotAllowed {
			t.Errorf("%s on an event: %d, want 405", m, status)
		}
		if status, _ := callAdmin(t, a, m, "/sangho_dedup/"); status != http.StatusMethodNotAllowed {
			t.Errorf("%s on the list: %d, want 405", m, status)
		}
	}
	if status, v := callAdmin(t, a, http.MethodGet, path+"evt_busy"); status != 200 || v["state"] != "in_flight" {
		t.Fatalf("the event in flight after the refusals: %d %v", status, v)
	}
	// routes: no other shape reaches an event
	for _, p := range []string{path + "evt_busy/x", "/sangho_dedup/" + h.Name + "/records/evt_busy", "/sangho_dedup/sangho/events/evt_busy"} {
		if status, _ := callAdmin(t, a, http.MethodGet, p); status != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, status)
		}
	}

	// a mark: the lease of an attempt that ran out
	if _, _, err := h.store.Claim(ctx, h.KeyPrefix+"evt_mark", "tok", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if status, v := callAdmin(t, a, http.MethodGet, path+"evt_mark"); status != 200 || v["state"] != "unknown" {
		t.Fatalf("GET a mark: %d %v", status, v)
	}
	if status, v := callAdmin(t, a, http.MethodDelete, path+"evt_mark"); status != http.StatusConflict || !strings.Contains(fmt.Sprint(v["error"]), "fate is unknown") {
		t.Errorf("DELETE a mark: %d %v; want 409, fate unknown", status, v)
	}
	if logs.Len() != 0 {
		t.Errorf("refused forgets were logged: %v", logs.All())
	}
	if status, v := callAdmin(t, a, http.MethodDelete, path+"evt_mark?force=true"); status != 200 || v["state"] != "unknown" {
		t.Fatalf("forced DELETE of a mark: %d %v; want 200 state unknown", status, v)
	}
	if status, v := callAdmin(t, a, http.MethodDelete, path+"evt_busy?force=true"); status != 200 || v["state"] != "in_flight" {
		t.Fatalf("forced DELETE in flight: %d %v; want 200 state in_flight", status, v)
	}
	got := logs.FilterMessage("event forgotten").All()
	if len(got) != 2 {
		t.Fatalf("%d lines event forgotten, want 2", len(got))
	}
	for i, want := range []string{"unknown", "in_flight"} {
		f := got[i].ContextMap()
		if f["state"] != want || f["force"] != true || f["event_id"] != []string{"evt_mark", "evt_busy"}[i] {
			t.Errorf("audit line %d: %v; want state %s, force true", i, f, want)
		}
	}
}

// fakeAdmin is an admin API that answers every request with serve.
func fakeAdmin(t *testing.T, serve http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(serve)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestCommandEscapesTheEventID: the ID and name go in the path escaped:
// `forget 'evt_1?force=true'` is a bad ID (400), not a forced forget of
// evt_1, and a name with '/' stays one segment.
func TestCommandEscapesTheEventID(t *testing.T) {
	var got []string
	addr := fakeAdmin(t, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.EscapedPath()+" query="+r.URL.RawQuery)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"not an event ID"}`)
	})
	code, _, err := runCommand(t, "forget", "evt_1?force=true", "address", addr, "name", "a/b")
	want := "/sangho_dedup/a%2Fb/events/evt_1%3Fforce=true query="
	if code != 2 || err == nil || len(got) != 1 || got[0] != want {
		t.Fatalf("forget 'evt_1?force=true' --name a/b: exit %d, %v, requests %q; want 2 and one request %q", code, err, got, want)
	}
}

// TestCommandErrorsExit2: every error exits 2 and says what went wrong,
// never 1 (the store has nothing for the event, to a script: never
// processed): the store down (503), a bad ID (400), an answer that is
// not the API's, a listing that is not JSON or empty, a forget that
// does not reach Caddy.
func TestCommandErrorsExit2(t *testing.T) {
	answer := func(status int, body string) string {
		return fakeAdmin(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		})
	}
	for _, c := range []struct {
		addr, verb, name, says string
	}{
		{answer(503, `{"error":"looking up \"evt_1\": redis: connection refused"}`), "get", "pay", "redis: connection refused"},
		{answer(503, `{"error":"forgetting \"evt_1\": redis: connection refused"}`), "forget", "pay", "redis: connection refused"},
		{answer(400, `{"error":"\"evt 1\" is not an event ID"}`), "get", "pay", "not an event ID"},
		{answer(502, "Bad Gateway from the proxy"), "get", "pay", "Bad Gateway from the proxy"},
		{answer(200, "<html>not the admin API</html>"), "get", "", "listing the endpoints"},
		{answer(200, "[]"), "get", "", "no sangho_dedup endpoint"},
		{"127.0.0.1:" + strconv.Itoa(freePort(t)), "forget", "pay", "is Caddy running"},
	} {
		flags := []string{"address", c.addr}
		if c.name != "" {
			flags = append(flags, "name", c.name)
		}
		code, _, err := runCommand(t, c.verb, "evt_1", flags...)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s %v: exit %d, %v; want 2 and %q", c.verb, flags, code, err, c.says)
		}
	}
}

// TestCommandPrintsTheState: the text output says what the API said:
// in flight is not "processed", a done record shows when it was
// processed, a mark when its lease ran out.
func TestCommandPrintsTheState(t *testing.T) {
	for state, want := range map[string][]string{
		"in_flight": {"evt_1: in flight", "expires at    2026-12-06T08:01:53Z"},
		"unknown":   {"evt_1: fate unknown", "lease ran out 2026-12-06T08:01:53Z"},
		"done":      {"evt_1: processed", "processed at  2026-12-03T08:01:53Z", "event type    invoice.paid"},
	} {
		addr := fakeAdmin(t, func(w http.ResponseWriter, r *http.Request) {
			info := map[string]any{"endpoint": "pay", "id": "evt_1", "state": state, "expires_at": "2026-12-06T08:01:53Z"}
			if state == "done" {
				info["processed_at"], info["event_type"] = "2026-12-03T08:01:53Z", "invoice.paid"
			}
			_ = json.NewEncoder(w).Encode(info)
		})
		code, out, err := runCommand(t, "get", "evt_1", "address", addr, "name", "pay")
		if code != 0 || err != nil {
			t.Errorf("get, %s: exit %d, %v", state, code, err)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("get, %s: output lacks %q:\n%s", state, w, out)
			}
		}
		if state != "done" && strings.Contains(out, "evt_1: processed") {
			t.Errorf("get, %s: output says processed:\n%s", state, out)
		}
	}
}

// TestCommandExitStatusAsAProcess: the exit status the process ends
// with, not only what runEventCommand returns: 1 for an absent event, 0
// for a found one, 2 with the API's message on stderr for an error.
// (Through the re-exec hook of TestCLIUsageErrorsExit2.)
func TestCommandExitStatusAsAProcess(t *testing.T) {
	addr := fakeAdmin(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/evt_never"):
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"endpoint":"pay","id":"evt_never","state":"absent"}`)
		case strings.HasSuffix(r.URL.Path, "/evt_done"):
			_, _ = io.WriteString(w, `{"endpoint":"pay","id":"evt_done","state":"done"}`)
		default:
			w.WriteHeader(503)
			_, _ = io.WriteString(w, `{"error":"looking up: redis: connection refused"}`)
		}
	})
	for id, c := range map[string]struct {
		code int
		says string
	}{"evt_never": {1, ""}, "evt_done": {0, ""}, "evt_down": {2, "redis: connection refused"}} {
		code, stderr := runCLI(t, "sangho-dedup get "+id+" --name pay --address "+addr)
		if code != c.code || !strings.Contains(stderr, c.says) {
			t.Errorf("caddy sangho-dedup get %s: exit %d, stderr %q; want %d and %q", id, code, stderr, c.code, c.says)
		}
	}
}

// TestAdminListAndNames: the list's JSON fields are the documented ones
// (scripts read them, not the Go struct); a key_prefix reaches only an
// endpoint named by default, not one given a name of its own; an absent
// event has no expires_at.
func TestAdminListAndNames(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.Name, h.KeyPrefix = "payments", "pay:" })
	a := &AdminAPI{logger: zap.NewNop()}
	rec := httptest.NewRecorder()
	if err := a.serve(rec, httptest.NewRequest(http.MethodGet, "/sangho_dedup/", nil)); err != nil {
		t.Fatal(err)
	}
	var list []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list) != 1 ||
		list[0]["name"] != "payments" || list[0]["store"] != "memory" || list[0]["key_prefix"] != "pay:" {
		t.Fatalf("GET /sangho_dedup/: %s; want [{name payments, store memory, key_prefix pay:}]", rec.Body)
	}
	if status, v := callAdmin(t, a, http.MethodGet, "/sangho_dedup/pay:/events/evt_1"); status != http.StatusNotFound || v["state"] != nil {
		t.Errorf("GET through the key_prefix of a named endpoint: %d %v; want 404, no such endpoint", status, v)
	}
	if status, v := callAdmin(t, a, http.MethodGet, "/sangho_dedup/"+h.Name+"/events/evt_1"); status != http.StatusNotFound || v["state"] != "absent" || v["expires_at"] != nil {
		t.Errorf("GET an absent event: %d %v; want 404 absent, no expires_at", status, v)
	}
}

// TestEventInfoTimes: the answer's processed_at is the record's, in UTC,
// and expires_at the entry's.
func TestEventInfoTimes(t *testing.T) {
	at, exp := time.Unix(1733140801, 0).In(time.FixedZone("x", 3600)), time.Unix(1733400001, 0)
	rec := dedup.DoneRecord{ProcessedAt: at, EventType: "invoice.paid", Fingerprint: "0123456789abcdef0123456789abcdef"}
	info := eventInfo("pay", "evt_1", dedup.Entry{Value: rec.Encode(), ExpiresAt: exp})
	if info.ProcessedAt == nil || !info.ProcessedAt.Equal(at) || info.ProcessedAt.Location() != time.UTC ||
		info.ExpiresAt == nil || !info.ExpiresAt.Equal(exp) {
		t.Fatalf("eventInfo: processed_at %v, expires_at %v; want %v UTC, %v", info.ProcessedAt, info.ExpiresAt, at.UTC(), exp)
	}
}

// TestRefusedForgetKeepsTheCommitRetry: a forget refused because the
// event is in flight (409) leaves a commit retry of the event running,
// as operations.md says: stopping it would leave a processed event
// unrecorded, and its redelivery would be processed again. (The Redis
// test TestForgetStopsCommitRetries says so too, but not with -short.)
func TestRefusedForgetKeepsTheCommitRetry(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	ctx := context.Background()
	key := h.KeyPrefix + "evt_busy_retry"
	if res, _, err := h.store.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	cr := commitRetries.add(h.storeData, key)
	defer commitRetries.remove(cr)
	if _, deleted, err := h.forget(ctx, key, false); err != nil || deleted {
		t.Fatalf("forget in flight: deleted %v, %v; want refused", deleted, err)
	}
	if stopped, _ := cr.attempt(func() error { return nil }); stopped {
		t.Fatal("a forget refused (in flight) stopped the commit retry")
	}
}

// TestCommandJSONIsJSONOnly: with --json, stdout is the API's answer
// alone, for a script to parse: no text lines after it.
func TestCommandJSONIsJSONOnly(t *testing.T) {
	addr := fakeAdmin(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"endpoint":"pay","id":"evt_1","state":"done"}`+"\n")
	})
	code, out, err := runCommand(t, "get", "evt_1", "address", addr, "name", "pay", "json", "true")
	var v map[string]any
	if code != 0 || err != nil || json.Unmarshal([]byte(out), &v) != nil || v["state"] != "done" {
		t.Fatalf("get --json: exit %d, %v, stdout %q; want 0 and the API's JSON alone", code, err, out)
	}
}
