package sanghodedup

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// TestEveryWayOfWritingTwoHundredCommits: the status line is the
// verdict however the next handler writes it, and whatever happens
// after it: 1xx lines (103 Early Hints) are not the answer; a body
// written without WriteHeader is an implicit 200, through Write or
// through ReadFrom (io.Copy from a reader without WriteTo, as a proxy
// copies a response); a 200 followed by a panic was still done. Each is
// committed: the redelivery is a duplicate, the backend reached once.
func TestEveryWayOfWritingTwoHundredCommits(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter, r *http.Request) error{
		"103 then 200": func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusOK)
			return nil
		},
		"Write, then error": func(w http.ResponseWriter, r *http.Request) error {
			_, _ = w.Write([]byte(`{"ok":true}`))
			return errors.New("client went away while the body was copied")
		},
		"ReadFrom, then error": func(w http.ResponseWriter, r *http.Request) error {
			_, _ = io.Copy(w, struct{ io.Reader }{strings.NewReader(`{"ok":true}`)})
			return errors.New("client went away while the body was copied")
		},
		"200, then panic": func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusOK)
			panic("backend bug after its answer")
		},
	}
	for name, first := range cases {
		t.Run(name, func(t *testing.T) {
			h, _ := newTestHandler(t, nil)
			calls := 0
			backend := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				calls++
				if calls == 1 {
					return first(w, r)
				}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			func() {
				defer func() { _ = recover() }()
				serve(h, signedRequest(bodyA, ""), backend)
			}()
			w, repl, _ := serve(h, signedRequest(bodyA, ""), backend)
			if outcomeOf(repl) != outcomeDuplicate || calls != 1 {
				t.Fatalf("redelivery: %d %q, backend reached %d times; want duplicate, once", w.Code, outcomeOf(repl), calls)
			}
		})
	}
}

// TestEvery2xxCommits: any 2xx, 299 too, is the backend saying it did
// the work: committed, so the redelivery is a duplicate. 199 and 300 are
// not 2xx: released.
func TestEvery2xxCommits(t *testing.T) {
	for _, status := range []int{200, 204, 299} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			h, _ := newTestHandler(t, nil)
			next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
				w.WriteHeader(status)
				return nil
			}}
			if _, repl, _ := serve(h, signedRequest(bodyA, ""), next); outcomeOf(repl) != outcomeProcessed {
				t.Fatalf("outcome %q, want processed", outcomeOf(repl))
			}
			if _, repl, _ := serve(h, signedRequest(bodyA, ""), next); outcomeOf(repl) != outcomeDuplicate || next.calls.Load() != 1 {
				t.Fatalf("redelivery %q, backend calls %d; want duplicate, 1", outcomeOf(repl), next.calls.Load())
			}
		})
	}
	for _, status := range []int{199, 300} {
		if v := judge(status, nil, false, false); v != toRelease {
			t.Fatalf("judge(%d) = %v, want release", status, v)
		}
	}
}

// failingCommits fails its first n Commits (a store briefly down), then
// lets them through.
type failingCommits struct {
	dedup.Store
	n     int32
	calls atomic.Int32
}

func (s *failingCommits) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	if s.calls.Add(1) <= s.n {
		return false, errors.New("i/o timeout")
	}
	return s.Store.Commit(ctx, key, token, rec, retention)
}

// TestCommitRetriedPastSeveralFailures: the done record of an event the
// backend processed is retried in the background until it lands, not
// given up after a retry that fails: here the commit and its first two
// retries fail, the third lands, and the redelivery is a duplicate.
func TestCommitRetriedPastSeveralFailures(t *testing.T) {
	h, logs := newTestHandler(t, nil)
	st := &failingCommits{Store: h.store, n: 3}
	h.store = st
	ok := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(200); return nil })
	if _, repl, _ := serve(h, signedRequest(bodyA, ""), ok); outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("first delivery: %q, want processed", outcomeOf(repl))
	}
	key := h.KeyPrefix + "evt_1QZtest000000000001" // bodyA's
	waitFor(t, "the commit retries to end", func() bool { return !commitRetries.pending(h.storeData, key) })
	if n := st.calls.Load(); n != 4 {
		t.Fatalf("%d commits tried, want 4 (the commit, two failed retries, one that landed)", n)
	}
	if logs.FilterMessage("commit retried").Len() != 1 || logs.FilterMessage("commit abandoned").Len() != 0 {
		t.Fatal("the record was not written by the retries")
	}
	next := &countingNext{}
	if w, repl, _ := serve(h, signedRequest(bodyA, ""), next); outcomeOf(repl) != outcomeDuplicate || next.calls.Load() != 0 {
		t.Fatalf("redelivery: %d %q, want duplicate", w.Code, outcomeOf(repl))
	}
}
