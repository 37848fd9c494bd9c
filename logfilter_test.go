package sanghodedup

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// signatureHeaders are the headers that carry a signature, from the
// code: each registered provider's default signature header, the Svix
// name that standard_webhooks also reads (TestProviderVectors, "svix
// header names"), and the header of each hmac recipe of
// docs/providers.md.
func signatureHeaders(t *testing.T) []string {
	t.Helper()
	set := map[string]bool{"Svix-Signature": true}
	configurable := 0
	for _, m := range caddy.GetModules("http.sangho_dedup.providers") {
		p, ok := m.New().(dedup.Provider)
		if !ok {
			t.Fatalf("%s is not a dedup.Provider", m.ID)
		}
		if h := p.Defaults().SignatureHeader; h != "" {
			set[http.CanonicalHeaderKey(h)] = true
		} else {
			configurable++ // hmac: the header is the user's
		}
	}
	if len(set) < 6 || configurable == 0 {
		t.Fatalf("signature headers from the providers: %v (%d configurable): is every provider registered?", set, configurable)
	}
	examples := codeBlocks(docSection(t, "docs/providers.md", "## Recipes"), "caddyfile")
	if len(examples) == 0 {
		t.Fatal("docs/providers.md Recipes: no caddyfile example")
	}
	hmacs := 0
	for _, ep := range recipeEndpoints(t, examples[0]) {
		for _, l := range ep.provider {
			if h, ok := strings.CutPrefix(l, "header "); ok {
				set[http.CanonicalHeaderKey(h)] = true
				hmacs++
			}
		}
	}
	if hmacs == 0 {
		t.Fatal("docs/providers.md: no hmac recipe with a header line")
	}
	var out []string
	for h := range set {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

var filterDelete = regexp.MustCompile(`(?m)^\s*request>headers>(\S+) delete$`)

// TestDocsLogFilter: docs/security.md's log filter names every
// provider's signature header, as Caddy logs it; it adapts as written;
// and, as the global log's and a site's filter of a running Caddy, no
// signature sent under any spelling of these names reaches the access
// log or the global log (reverse_proxy's debug lines), while the other
// headers are logged.
func TestDocsLogFilter(t *testing.T) {
	doc := markedBlock(t, "docs/security.md", "log-filter")
	adaptCaddyfile(t, doc) // fails the test if it does not adapt
	filtered := map[string]bool{}
	for _, m := range filterDelete.FindAllStringSubmatch(doc, -1) {
		if m[1] != http.CanonicalHeaderKey(m[1]) {
			t.Errorf("docs/security.md filter: %s is not written as Caddy logs it (%s)", m[1], http.CanonicalHeaderKey(m[1]))
		}
		filtered[m[1]] = true
	}
	headers := signatureHeaders(t)
	for _, h := range headers {
		if !filtered[h] {
			t.Errorf("docs/security.md filter has no line for %s", h)
		}
	}

	inner := regexp.MustCompile(`(?s)format filter \{\n(.*?)\n\s*\}`).FindStringSubmatch(doc)
	if inner == nil {
		t.Fatal("docs/security.md: no format filter block")
	}
	ownDataDir(t)
	dir := t.TempDir()
	globalLog, accessLog := filepath.Join(dir, "global.log"), filepath.Join(dir, "access.log")
	backend := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(backend.Close)
	port := freePort(t)
	cfg := `{
	admin off
	auto_https off
	persist_config off
	log {
		output file ` + globalLog + `
		level DEBUG
		format filter {
` + inner[1] + `
		}
	}
}
http://127.0.0.1:` + strconv.Itoa(port) + ` {
	bind 127.0.0.1
	log {
		output file ` + accessLog + `
		format filter {
` + inner[1] + `
		}
	}
	reverse_proxy ` + strings.TrimPrefix(backend.URL, "http://") + `
}
`
	adapted, _ := adaptCaddyfile(t, cfg)
	if err := caddyLoad(adapted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(port)+"/", strings.NewReader("{}"))
	req.Header.Set("X-Canary", "canary-value-7f3a")
	var values []string
	for i, h := range headers {
		v := "sigvalue-" + strconv.Itoa(i) + "-c0ffee"
		name := h
		if i%2 == 0 {
			name = strings.ToLower(h) // as Standard Webhooks writes it: on the wire, any case
		}
		req.Header[name] = []string{v}
		values = append(values, v)
	}
	if a := do(t, req); a.status != 200 {
		t.Fatalf("the request through the proxy: %d", a.status)
	}
	_ = caddy.Stop() // flushes the logs
	for _, f := range []string{accessLog, globalLog} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "canary-value-7f3a") {
			t.Fatalf("%s does not log the request's headers; the test proves nothing:\n%s", filepath.Base(f), b)
		}
		for i, v := range values {
			if strings.Contains(string(b), v) {
				t.Errorf("%s holds %s's value", filepath.Base(f), headers[i])
			}
		}
	}
}

// TestDocsRedisSiteKeepsTheSignatureOutOfLogs runs docs/redis.md's
// production site (its Redis a local one without TLS or ACL user, its
// app down) at Caddy's default log level, and sends it a signed event:
// reverse_proxy's failure (502) is logged by Caddy at error level with
// the request's headers, in the global log, which the site's own `log`
// filter does not reach. Neither log may hold the signature. (Found by
// a new-user walk-through: the recipe filtered the access log only.)
func TestDocsRedisSiteKeepsTheSignatureOutOfLogs(t *testing.T) {
	src := markedBlock(t, "docs/redis.md", "redis-site")
	r := startRedis(t)
	t.Setenv("SANGHO_WEBHOOK_SECRET", secret1)
	t.Setenv("SANGHO_WEBHOOK_SECRET_OLD", "whsec_the_old_one")
	dir := t.TempDir()
	globalLog, accessLog := filepath.Join(dir, "global.log"), filepath.Join(dir, "access.log")
	port := freePort(t)
	cfg := src
	for _, c := range []struct{ old, new string }{
		{"{\n", "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n"},
		{"webhooks.example.com {\n", "http://127.0.0.1:" + strconv.Itoa(port) + " {\n\tbind 127.0.0.1\n"},
		{"address redis.internal:6379", "address " + r.Addr},
		{"\t\t\t\tusername caddy\n", ""},
		{"\t\t\t\tpassword {env.REDIS_PASSWORD}\n", ""},
		{"\t\t\t\ttls\n", ""},
		{"reverse_proxy app:3000", "reverse_proxy 127.0.0.1:" + strconv.Itoa(freePort(t))},
	} {
		if !strings.Contains(cfg, c.old) {
			t.Fatalf("docs/redis.md redis-site: no %q to replace in:\n%s", c.old, src)
		}
		cfg = strings.Replace(cfg, c.old, c.new, 1)
	}
	// Each log to its file: the site's block (the access log) in the
	// site; the global one in the global options, the recipe's own block
	// or else Caddy's default log.
	const logBlock = "\tlog {\n\t\tformat filter"
	site := strings.Index(cfg, "http://127.0.0.1:")
	global, inSite := cfg[:site], cfg[site:]
	if !strings.Contains(inSite, logBlock) {
		t.Fatalf("docs/redis.md redis-site: the site has no log filter:\n%s", src)
	}
	inSite = strings.Replace(inSite, logBlock, "\tlog {\n\t\toutput file "+accessLog+"\n\t\tformat filter", 1)
	if strings.Contains(global, logBlock) {
		global = strings.Replace(global, logBlock, "\tlog {\n\t\toutput file "+globalLog+"\n\t\tformat filter", 1)
	} else {
		global = strings.Replace(global, "\tpersist_config off\n", "\tpersist_config off\n\tlog {\n\t\toutput file "+globalLog+"\n\t}\n", 1)
	}
	cfg = global + inSite
	adapted, _ := adaptCaddyfile(t, cfg)
	ownDataDir(t)
	if err := caddyLoad(adapted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	body := `{"id":"evt_redis_log","type":"invoice.paid"}`
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(port)+"/sangho", strings.NewReader(body))
	sig := sangho.Sign(time.Now(), []byte(body), secret1)
	req.Header.Set("Sangho-Signature", sig)
	if a := do(t, req); a.status != http.StatusBadGateway {
		t.Fatalf("a signed event with the app down: %d, want 502", a.status)
	}
	_ = caddy.Stop() // flushes the logs
	_, v1, _ := strings.Cut(sig, "v1=")
	b, err := os.ReadFile(globalLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"logger":"http.log.error`) || !strings.Contains(string(b), `"uri":"/sangho"`) {
		t.Fatalf("the global log holds no error line for the failed request; the test proves nothing:\n%s", b)
	}
	for _, f := range []string{globalLog, accessLog} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), v1) {
			t.Errorf("%s holds the signature:\n%s", filepath.Base(f), b)
		}
	}
}
