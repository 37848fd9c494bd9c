package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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
		"SANGHO_BENCH requests=50000 duration_us=5000000 non2xx=7 connect=0 read=1 write=0 timeout=2 p50_us=600 p90_us=1500 p99_us=3200 max_us=41000 fresh_used=50020 exhausted=0 init_cpu_us=812345\n"
	r, exhausted, initCPU, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 50000 || r.Seconds != 5 || r.Throughput != 10000 || r.P50 != 0.6 || r.P90 != 1.5 || r.P99 != 3.2 || r.Max != 41 ||
		r.ByStatus["2xx"] != 49993 || r.ByStatus["non-2xx"] != 7 || r.ByStatus["error"] != 3 || r.NewSent != 50020 || exhausted != 0 || initCPU != 812345 {
		t.Fatalf("parsed %+v, exhausted %d, init CPU %d µs", r, exhausted, initCPU)
	}
	for _, bad := range []string{
		"Requests/sec: 10000\n",
		"SANGHO_BENCH requests=50000 duration_us=5000000\n",
		strings.Replace(out, "p99_us=3200", "p99_us=3.2ms", 1),
		strings.Replace(out, "duration_us=5000000", "duration_us=0", 1),
		strings.Replace(out, " init_cpu_us=812345", "", 1),
	} {
		if _, _, _, err := parseWrk(bad); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

// wrk with wrk.lua sends what the plugin accepts: every body is the
// signed one (a signature over other bytes would be 401 and the
// benchmark would measure rejections), its top-level "id" is the event
// ID header, it is the run's body (its size, one long string or many
// small nested objects), new events are each sent once and
// redeliveries reuse a sent event. Runs the real wrk against a server
// that checks all that, with 1 KiB bodies and the nested 64 KiB ones
// (redeliveries do not depend on the body).
func TestWrkSendsSignedEventsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs wrk")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Fatal("wrk is not on the PATH: install it (apt-get install wrk; .ci/run and make bench do)")
	}
	const secret = "whsec_test"
	for _, run := range []struct {
		size   int
		nested bool
		dup    float64
	}{{1024, false, 0}, {1024, false, 0.5}, {64 << 10, true, 0}} {
		name := fmt.Sprintf("%s dup %v", (&scenario{body: run.size, nested: run.nested}).bodyName(), run.dup)
		var mu sync.Mutex
		seen := map[string]int{}
		var bad []string
		var template []byte // the run's body without its ID
		firstSent := false
		// a server per run: Close waits for the run's last requests
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return // cut off as wrk stopped: not a request it counts
			}
			sig := r.Header.Get("Sangho-Signature")
			ts, _, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",")
			sec, _ := strconv.ParseInt(ts, 10, 64)
			id := r.Header.Get("Sangho-Event-ID")
			mu.Lock()
			defer mu.Unlock()
			// The first body is checked in full (decoding 64 KiB of
			// small objects under -race for each would leave wrk a few
			// dozen requests a second); every other is the same body
			// around its own ID, at the same place.
			switch tmpl := bytes.Replace(body, []byte(id), nil, 1); {
			case sig != sangho.Sign(time.Unix(sec, 0), body, secret):
				bad = append(bad, "signature")
			case template == nil:
				if err := checkEvent(body, id, run.size, run.nested); err != nil {
					bad = append(bad, id+": "+err.Error())
				}
				template = tmpl
			case len(body) != run.size || !bytes.Equal(tmpl, template) || !bytes.Contains(body, []byte(`"id":"`+id+`"`)):
				bad = append(bad, id+": not the run's body around its ID")
			}
			seen[id]++
			if last := id[strings.LastIndex(id, "_")+1:]; strings.HasPrefix(last, "n") && strings.Trim(last[1:], "0") == "" {
				firstSent = true // evt_<hex>_<run>_n000…: wrkData's first new event
			}
			w.WriteHeader(http.StatusOK)
		}))
		cfg := load.Config{URL: srv.URL, Secret: secret, Concurrency: 4, Duration: time.Second, BodySize: run.size, Nested: run.nested, Duplicates: run.dup}
		if run.dup > 0 {
			cfg.Warmup = 4
		}
		// The load starts once, after the warm-up (sent before wrk), as
		// wrk.lua says so: Caddy's CPU is counted from there.
		starts, seenAtStart := 0, -1
		loadStarts = func() {
			starts++
			mu.Lock()
			seenAtStart = len(seen)
			mu.Unlock()
		}
		res, err := wrkRun(context.Background(), wrk, t.TempDir(), cfg, true)
		loadStarts = nil
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		repeats := 0
		for _, n := range seen {
			repeats += n - 1
		}
		if len(bad) > 0 {
			t.Fatalf("%s: %d bad requests, first: %s", name, len(bad), bad[0])
		}
		if res.Requests < 100 || res.ByStatus["2xx"] != res.Requests || res.GeneratorCPU <= 0 {
			t.Fatalf("%s: %+v", name, res)
		}
		if starts != 1 || seenAtStart < cfg.Warmup || seenAtStart > cfg.Warmup+res.Requests/2 {
			t.Errorf("%s: the load started %d times, with %d events seen then (warm-up %d, %d requests)", name, starts, seenAtStart, cfg.Warmup, res.Requests)
		}
		if run.dup == 0 && !firstSent {
			// wrk calls request() once before the run to see what it
			// sends, and never sends that one: the script must not use
			// the first new event up on it.
			t.Errorf("%s: the first signed new event was never sent", name)
		}
		if run.dup == 0 && repeats != 0 {
			t.Errorf("%s: %d new events sent more than once", name, repeats)
		}
		if run.dup > 0 && (repeats < res.Requests/4 || repeats > res.Requests*3/4) {
			t.Errorf("%s: %d repeats of %d requests, want about half", name, repeats, res.Requests)
		}
		mu.Unlock()
	}
}

// runWrkCmd hands back everything wrk printed, however long a line, with
// stderr, and calls loadStarts once, at the script's ready line, which it
// leaves out; a run that never says it started is an error.
func TestRunWrkCmd(t *testing.T) {
	defer func() { loadStarts = nil }()
	long := strings.Repeat("x", 200<<10) // past bufio.Scanner's 64 KiB line
	// The script leaves a file just before its ready line: loadStarts
	// must find it, so it is called at that line, not before wrk runs.
	mark := filepath.Join(t.TempDir(), "ready")
	script := `printf 'Running\n'; head -c ` + strconv.Itoa(len(long)) + ` /dev/zero | tr '\0' x; echo; echo oops >&2; touch ` + mark + `; echo ` + wrkReady + `; echo SANGHO_BENCH requests=1; echo ` + wrkReady
	starts := 0
	var before string
	loadStarts = func() {
		starts++
		if _, err := os.Stat(mark); err != nil {
			t.Errorf("loadStarts called before the ready line: %v", err)
		}
	}
	out, err := runWrkCmd(exec.Command("sh", "-c", script))
	if err != nil {
		t.Fatal(err)
	}
	if starts != 1 {
		t.Fatalf("loadStarts called %d times, want 1", starts)
	}
	before, _, _ = strings.Cut(out, "SANGHO_BENCH requests=1")
	if !strings.Contains(before, "Running\n"+long+"\n") || !strings.Contains(out, "oops") || strings.Count(out, wrkReady) != 1 {
		t.Fatalf("output not handed back whole (%d bytes): %.200q", len(out), out)
	}
	if _, err := runWrkCmd(exec.Command("sh", "-c", "echo SANGHO_BENCH requests=1")); err == nil || !strings.Contains(err.Error(), wrkReady) {
		t.Fatalf("no ready line: err %v", err)
	}
	if _, err := runWrkCmd(exec.Command("sh", "-c", "echo "+wrkReady+"; echo broken >&2; exit 3")); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("failed run: err %v", err)
	}
}

// wrkEvents signs enough new events for a run at wrkMaxRate when the
// memory allows, and never more than the memory's worth of requests.
func TestWrkEvents(t *testing.T) {
	for _, c := range []struct {
		size   int
		d      time.Duration
		memory int
	}{{1024, 5 * time.Second, 4 << 30}, {64 << 10, 5 * time.Second, 4 << 30}, {64 << 10, 5 * time.Second, 1 << 30}, {1 << 20, time.Second, 4 << 30}} {
		n := wrkEvents(c.size, c.d, 32, c.memory)
		if n*(c.size+300) > c.memory {
			t.Errorf("%d bytes, %v, %d MiB: %d requests are over the memory", c.size, c.d, c.memory>>20, n)
		}
		if need := int(wrkMaxRate(c.size)*c.d.Seconds()) + 32; n < need && (n+1)*(c.size+300) <= c.memory {
			t.Errorf("%d bytes, %v, %d MiB: %d events, fewer than the %d a run at wrkMaxRate can use", c.size, c.d, c.memory>>20, n, need)
		}
	}
	if m := wrkMemory(); m <= 0 || m > 4<<30 {
		t.Errorf("wrkMemory() = %d", m)
	}
}
