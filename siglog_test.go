package sanghodedup

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Rejected signatures are logged at warn, sampled (issue 24, item 12):
// an operator running the example at the default log level sees the
// first one at once; a flood of forged requests writes one line per
// sigRejectEvery with its count, never one line per request.

// TestSigRejectLogBoundsAFlood: notes from four goroutines for 300 ms
// with a 50 ms window give at most one line per window (plus the first
// and the one stop writes), lines a window apart (less the time zap takes
// to write one), and counts that add up to every note.
func TestSigRejectLogBoundsAFlood(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	const every = 50 * time.Millisecond
	s := &sigRejectLog{every: every, logger: zap.New(core)}
	start := time.Now()
	var notes atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1_000_000 && time.Since(start) < 300*time.Millisecond; i++ {
				s.note(zap.String("reason", "mismatch"), zap.String("remote_ip", "127.0.0.1"))
				notes.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	s.stop()
	s.note(zap.String("reason", "mismatch")) // after stop: counted nowhere, no timer left behind

	lines := logs.FilterMessage("signatures rejected").All()
	if max := int(elapsed/every) + 2; len(lines) > max || len(lines) < 2 {
		t.Fatalf("%d lines for %d rejections in %v, want 2 to %d", len(lines), notes.Load(), elapsed, max)
	}
	var sum int64
	for i, l := range lines {
		if l.Level != zapcore.WarnLevel {
			t.Errorf("line %d at %s, want warn", i, l.Level)
		}
		c, _ := l.ContextMap()["count"].(int64)
		if i == 0 && c != 1 {
			t.Errorf("the first line's count is %d, want 1: the first rejection is logged at once", c)
		}
		if l.ContextMap()["reason"] != "mismatch" {
			t.Errorf("line %d: no reason: %v", i, l.ContextMap())
		}
		sum += c
		if i > 0 && i < len(lines)-1 {
			if gap := l.Time.Sub(lines[i-1].Time); gap < every-every/5 {
				t.Errorf("lines %d and %d %v apart, want at least %v", i-1, i, gap, every)
			}
		}
	}
	if sum != notes.Load() {
		t.Errorf("the lines count %d rejections, want %d", sum, notes.Load())
	}
}

// TestServerSignatureRejectionsLogged: through a real Caddy at the
// default log level, the first bad signature is in the log at warn at
// once, without the signature; 100 more within the window add no line
// until Caddy stops, whose line counts them.
func TestServerSignatureRejectionsLogged(t *testing.T) {
	ownDataDir(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	cfg := strings.Replace(serverCaddyfile(port, dedupSite("127.0.0.1:1", "store memory")), "output discard", "output file "+logFile, 1)
	adapted, _ := adaptCaddyfile(t, cfg)
	start := time.Now()
	if err := caddyLoad(adapted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook"
	forged := func() string {
		sig := sangho.Sign(time.Now(), []byte(bodyA), secret2)
		r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(bodyA))
		r.Header.Set("Sangho-Signature", sig)
		if a := do(t, r); a.status != 401 {
			t.Fatalf("a forged delivery: %d", a.status)
		}
		return sig[strings.Index(sig, "v1=")+3:]
	}
	type line struct {
		Level, Msg, Reason string
		Count              int64
	}
	read := func() (lines []line, all string) {
		b, _ := os.ReadFile(logFile)
		for _, l := range strings.Split(string(b), "\n") {
			var e line
			if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "signatures rejected" {
				lines = append(lines, e)
			}
		}
		return lines, string(b)
	}
	sigs := []string{forged()}
	waitFor(t, "the first rejection's line", func() bool { l, _ := read(); return len(l) == 1 })
	for range 100 {
		sigs = append(sigs, forged())
	}
	elapsed := time.Since(start)
	if l, _ := read(); len(l) != 1 && elapsed < sigRejectEvery {
		t.Fatalf("%d lines after 101 rejections in %v, want 1 until %v has passed", len(l), elapsed, sigRejectEvery)
	}
	_ = caddy.Stop() // Cleanup writes the pending line
	lines, all := read()
	var sum int64
	for _, l := range lines {
		if l.Level != "warn" || l.Reason != "mismatch" {
			t.Errorf("line %+v, want warn with reason mismatch", l)
		}
		sum += l.Count
	}
	if max := 2 + int(elapsed/sigRejectEvery); len(lines) > max || sum != 101 || lines[0].Count != 1 {
		t.Errorf("lines %+v: want at most %d, the first with count 1, 101 in all", lines, max)
	}
	for _, sig := range sigs {
		if strings.Contains(all, sig) {
			t.Fatalf("a signature is in the log:\n%s", all)
		}
	}
}
