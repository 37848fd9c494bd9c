package sanghodedup

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// No log line caused by this module's answers carries a signature: the
// review's case was Caddy's error log line for the 503 "dedup store
// unavailable" this handler returned, which logs the request's headers
// (Caddy redacts only Authorization and cookies). Without handle_errors
// the handler writes its rejections itself and logs them without
// headers. The access log, which logs every request's headers, is kept
// clean by the filter the README and example.Caddyfile give. The
// backend still gets the header when the event is passed on.
func TestSignatureHeadersStayOutOfLogs(t *testing.T) {
	ownDataDir(t)
	dir := t.TempDir()
	errLog, accessLog := filepath.Join(dir, "error.log"), filepath.Join(dir, "access.log")
	down := startRedis(t)
	down.Kill()
	var gotSig atomic.Value // the Sangho-Signature the backend got
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotSig.Store(r.Header.Get("Sangho-Signature"))
	}))
	t.Cleanup(backend.Close)
	backendAddr := strings.TrimPrefix(backend.URL, "http://")
	port := freePort(t)
	site := `	log {
		output file ` + accessLog + `
		format filter {
			request>headers>Sangho-Signature delete
		}
	}
	handle /down {
		sangho_dedup {
			secret ` + secret1 + `
			` + redisStoreLine(down.Addr) + `
		}
		reverse_proxy ` + backendAddr + `
	}
	handle {
		sangho_dedup {
			secret ` + secret1 + `
			store memory
			name mem
		}
		reverse_proxy ` + backendAddr + `
	}`
	cfg := strings.Replace(serverCaddyfile(port, site), "output discard", "output file "+errLog+"\n\t\tlevel DEBUG", 1)
	adapted, _ := adaptCaddyfile(t, cfg)
	if err := caddyLoad(adapted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	base := "http://127.0.0.1:" + strconv.Itoa(port)

	var sigs []string
	post := func(path, sig string) answer {
		t.Helper()
		sigs = append(sigs, sig)
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(bodyA))
		req.Header.Set("Sangho-Signature", sig)
		return do(t, req)
	}
	good := func() string { return sangho.Sign(time.Now(), []byte(bodyA), secret1) }
	if a := post("/down", good()); a.status != 503 {
		t.Fatalf("store down: %d", a.status)
	}
	if a := post("/webhook", sangho.Sign(time.Now(), []byte(bodyA), secret2)); a.status != 401 {
		t.Fatalf("wrong secret: %d", a.status)
	}
	passed := good()
	if a := post("/webhook", passed); a.status != 200 || a.dedup != "" {
		t.Fatalf("new event: %d %q", a.status, a.dedup)
	}
	// signed a second earlier: another signature than the first delivery's
	if a := post("/webhook", sangho.Sign(time.Now().Add(-time.Second), []byte(bodyA), secret1)); a.dedup != "duplicate" {
		t.Fatalf("redelivery: %d %q", a.status, a.dedup)
	}
	_ = caddy.Stop() // flushes the logs

	logs := ""
	for _, f := range []string{errLog, accessLog} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		logs += string(b)
	}
	if !strings.Contains(logs, `"store failed"`) || strings.Count(logs, `"handled request"`) != len(sigs) {
		t.Fatalf("the 503 or a request was not logged; the test proves nothing:\n%s", logs)
	}
	for _, sig := range sigs {
		// The event passed on is reverse_proxy's to log (its debug
		// "upstream roundtrip" line carries the headers it sends).
		if sig != passed && strings.Contains(logs, sig[strings.Index(sig, "v1=")+3:]) {
			t.Errorf("a signature is in the logs: %s\n%s", sig, logs)
		}
	}
	if got, _ := gotSig.Load().(string); got != passed {
		t.Errorf("the backend got Sangho-Signature %q, want the one sent", got)
	}
}
