package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// The test binary is also the Caddy of -filescale serve's test: it
// imports Caddy's standard modules and the plugin (main_test.go), so
// re-run with this variable it is `caddy run`, and nothing has to be
// built.
const testCaddyEnv = "SANGHO_BENCH_TEST_CADDY"

func TestMain(m *testing.M) {
	if os.Getenv(testCaddyEnv) == "1" {
		caddycmd.Main()
		return
	}
	os.Exit(m.Run())
}

// -filescale serve on a small filled store: Caddy (this test binary)
// starts on the store with its files evicted, listens and answers the
// first event, then takes a few seconds of signed events with resends,
// every one answered right (new ones passed on to the sink, resends
// answered as duplicates), and its RSS is sampled all along. The new
// events land in the store given, next to the fill's records.
func TestFileScaleServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Caddy for a few seconds")
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := filestore.BenchFill(path, 2000, time.Now(), scaleHours, scaleRetention, nil); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := fileScaleServe(serveConfig{caddy: self, env: []string{testCaddyEnv + "=1"}, path: path,
		duration: 3 * time.Second, rate: 50, resend: 0.3, sample: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
	c := rep.sent
	if rep.listen <= 0 || rep.firstAnswer < rep.listen || rep.firstAnswer > time.Minute {
		t.Errorf("listen %v, first answer %v", rep.listen, rep.firstAnswer)
	}
	if rep.rssOpen <= 0 || rep.hwmOpen < rep.rssOpen || rep.hwm < rep.hwmOpen {
		t.Errorf("RSS after the open %d KiB (VmHWM %d), VmHWM at the end %d", rep.rssOpen, rep.hwmOpen, rep.hwm)
	}
	if len(rep.rss) < 10 {
		t.Errorf("%d RSS samples over 3 s every 200 ms", len(rep.rss))
	}
	// 150 events due in 3 s at 50/s
	if n := c.newSent + c.resent; n < 140 || n > 150 || c.resent < 20 || c.newSent < 60 {
		t.Errorf("%d new events and %d resends", c.newSent, c.resent)
	}
	if c.wrong != 0 || c.byStatus["200"] != c.newSent+c.resent || len(c.lat) != c.newSent+c.resent {
		t.Errorf("answers %v, %d wrong, %d latencies", c.byStatus, c.wrong, len(c.lat))
	}
	for _, want := range []string{"listening after", "RSS during the traffic", "wrong answers 0", "latency: p50", "load average"} {
		if !strings.Contains(rep.String(), want) {
			t.Errorf("the report has no %q", want)
		}
	}
	// Caddy used the store given: the fill's records and the run's new
	// events (and the first one) are in it.
	st, err := filestore.OpenForBench(path, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n, err := st.Entries()
	if cerr := st.BenchClose(); err == nil {
		err = cerr
	}
	if want := 1998 + c.newSent + 1; err != nil || n < want {
		t.Errorf("the store holds %d records, %v; want at least %d", n, err, want)
	}
}

// The traffic's check of the answers: against an endpoint that
// deduplicates, none is wrong; against one that passes every resend on
// as new, every resend is wrong; against one that fails, all are.
func TestServeDriveChecksAnswers(t *testing.T) {
	endpoint := func(dedup bool, status int) *httptest.Server {
		var mu sync.Mutex
		seen := map[string]bool{}
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("Sangho-Event-ID")
			if r.Header.Get("Sangho-Signature") == "" || id == "" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			mu.Lock()
			dup := seen[id]
			seen[id] = true
			mu.Unlock()
			if dup && dedup {
				w.Header().Set("Sangho-Dedup", "duplicate")
			}
			w.WriteHeader(status)
		}))
	}
	for _, tc := range []struct {
		name   string
		dedup  bool
		status int
		wrong  func(c serveCounts) int
	}{
		{"dedups", true, 200, func(serveCounts) int { return 0 }},
		{"passes resends on", false, 200, func(c serveCounts) int { return c.resent }},
		{"fails", true, 500, func(c serveCounts) int { return c.newSent + c.resent }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := endpoint(tc.dedup, tc.status)
			defer srv.Close()
			c := serveDrive(context.Background(), srv.URL, 100, 0.5, time.Second)
			if c.newSent+c.resent < 95 || (tc.status == 200 && c.resent < 20) {
				t.Fatalf("%d new, %d resends in 1 s at 100/s", c.newSent, c.resent)
			}
			if c.wrong != tc.wrong(c) {
				t.Errorf("%d wrong answers of %d new and %d resends (%v), want %d", c.wrong, c.newSent, c.resent, c.byStatus, tc.wrong(c))
			}
		})
	}
}
