package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// parseWrk reads wrk.lua's summary line: the figures land in the right
// fields (a swapped or misscaled field would move every ratio of the
// report), and a cut or missing line is an error, never zeros.
func TestParseWrk(t *testing.T) {
	out := "Running 5s test @ http://127.0.0.1:1/\n  1 threads and 32 connections\n" +
		"SANGHO_BENCH requests=50000 duration_us=5000000 non2xx=7 connect=0 read=1 write=0 timeout=2 p50_us=600 p90_us=1500 p99_us=3200 max_us=41000 fresh_used=50020 exhausted=0\n"
	r, exhausted, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 50000 || r.Seconds != 5 || r.Throughput != 10000 || r.P50 != 0.6 || r.P90 != 1.5 || r.P99 != 3.2 || r.Max != 41 ||
		r.ByStatus["2xx"] != 49993 || r.ByStatus["non-2xx"] != 7 || r.ByStatus["error"] != 3 || r.NewSent != 50020 || exhausted != 0 {
		t.Fatalf("parsed %+v, exhausted %d", r, exhausted)
	}
	for _, bad := range []string{
		"Requests/sec: 10000\n",
		"SANGHO_BENCH requests=50000 duration_us=5000000\n",
		strings.Replace(out, "p99_us=3200", "p99_us=3.2ms", 1),
		strings.Replace(out, "duration_us=5000000", "duration_us=0", 1),
	} {
		if _, _, err := parseWrk(bad); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

// wrk with wrk.lua sends what the plugin accepts: every body is the
// signed one (a signature over other bytes would be 401 and the
// benchmark would measure rejections), its top-level "id" is the event
// ID header, new events are each sent once and redeliveries reuse a
// sent event. Runs the real wrk against a server that checks all that.
func TestWrkSendsSignedEventsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs wrk")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Fatal("wrk is not on the PATH: install it (apt-get install wrk; .ci/run and make bench do)")
	}
	const secret = "whsec_test"
	var mu sync.Mutex
	seen := map[string]int{}
	var bad []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sig := r.Header.Get("Sangho-Signature")
		ts, _, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",")
		sec, _ := strconv.ParseInt(ts, 10, 64)
		var ev struct {
			ID string `json:"id"`
		}
		jerr := json.Unmarshal(body, &ev)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case sig != sangho.Sign(time.Unix(sec, 0), body, secret):
			bad = append(bad, "signature")
		case jerr != nil || ev.ID == "" || ev.ID != r.Header.Get("Sangho-Event-ID"):
			bad = append(bad, "id "+ev.ID)
		case len(body) < 900 || len(body) > 1100:
			bad = append(bad, "size "+strconv.Itoa(len(body)))
		}
		seen[ev.ID]++
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	for _, dup := range []float64{0, 0.5} {
		clear(seen)
		cfg := load.Config{URL: srv.URL, Secret: secret, Concurrency: 4, Duration: time.Second, BodySize: 1024, Duplicates: dup}
		if dup > 0 {
			cfg.Warmup = 4
		}
		res, err := wrkRun(context.Background(), wrk, t.TempDir(), cfg, true)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		repeats := 0
		for _, n := range seen {
			repeats += n - 1
		}
		if len(bad) > 0 {
			t.Fatalf("dup %v: %d bad requests, first: %s", dup, len(bad), bad[0])
		}
		if res.Requests < 100 || res.ByStatus["2xx"] != res.Requests {
			t.Fatalf("dup %v: %+v", dup, res)
		}
		if dup == 0 && repeats != 0 {
			t.Errorf("new events only: %d sent more than once", repeats)
		}
		if dup > 0 && (repeats < res.Requests/4 || repeats > res.Requests*3/4) {
			t.Errorf("half redeliveries: %d repeats of %d requests", repeats, res.Requests)
		}
		mu.Unlock()
	}
}
