package sanghodedup

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

// The documented multi-sender sites guard what they proxy: Caddy's path
// matcher is exact, so `sangho_dedup /github` beside a site-wide
// reverse_proxy let POST /github/, /github/x and / reach the backend
// unsigned (issue 24). Each site is run as written, its backend the
// ledger: a delivery signed as each sender signs reaches the backend
// once; an unsigned request to any neighbouring path, with any method,
// reaches nothing.

// recipeCase is the provider case of a documented endpoint path.
func recipeCase(t *testing.T, path string) providerCase {
	t.Helper()
	name := strings.TrimPrefix(path, "/")
	if name == "svix" {
		name = "standard_webhooks"
	}
	return providerCaseNamed(t, name)
}

// markedBlock returns the fenced code block that follows
// <!-- test: name --> in a Markdown file, as the reader sees it.
func markedBlock(t *testing.T, file, name string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- test: " + regexp.QuoteMeta(name) + " -->\n[ \t]*```\\w*\n(.*?)[ \t]*```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no code block marked <!-- test: %s -->", file, name)
	}
	return string(m[1])
}

// siteBody is the inside of a Caddyfile of one site block.
func siteBody(t *testing.T, src string) string {
	t.Helper()
	src = strings.TrimSpace(src)
	first, rest, _ := strings.Cut(src, "\n")
	if !strings.HasSuffix(first, " {") || !strings.HasSuffix(rest, "\n}") {
		t.Fatalf("not one site block:\n%s", src)
	}
	return strings.TrimSuffix(rest, "}")
}

// checkGuardedSite runs the documented site src (one site block, its
// backend written `reverse_proxy 127.0.0.1:3000`) and checks that only
// the signed deliveries to its endpoints reach the backend.
func checkGuardedSite(t *testing.T, src string) {
	t.Helper()
	eps := recipeEndpoints(t, src)
	if len(eps) < 2 {
		t.Fatalf("%d guarded endpoints found, want at least 2:\n%s", len(eps), src)
	}
	for _, ep := range eps {
		t.Setenv(ep.secretEnv, recipeCase(t, ep.path).secrets[0])
	}
	l := ledger.New(t)
	const upstream = "reverse_proxy 127.0.0.1:3000"
	body := strings.ReplaceAll(siteBody(t, src), upstream,
		"reverse_proxy "+l.Addr+" {\n\t\t\theader_up Sangho-Event-ID {http.sangho_dedup.event_id}\n\t\t}")
	s := startCaddy(t, body)
	base := strings.TrimSuffix(s.url, "/webhook")
	now := time.Now()

	paths := map[string]bool{}
	for _, ep := range eps {
		paths[ep.path] = true
	}
	for n, ep := range eps {
		p := recipeCase(t, ep.path)
		signed := p.delivery(t, base+ep.path, p.id(100+n), now, p.secrets[0])
		if a := do(t, signed); a.status != 200 || a.dedup != "" {
			t.Errorf("%s: a signed delivery: %d %q (%s), want processed", ep.path, a.status, a.dedup, a.body)
		}
		// The same delivery without its signature, to the endpoint and
		// to every neighbouring path, with each method.
		targets := []string{ep.path, ep.path + "/", ep.path + "/x", ep.path + "x", ep.path + "/..", ep.path + "%2F",
			strings.ToUpper(ep.path), "/", "/x", "/webhook", "/" + ep.path}
		for _, target := range targets {
			for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodGet, http.MethodDelete} {
				r := resend(t, p.delivery(t, base+target, p.id(200+n), now, p.secrets[0]), func(h http.Header, b []byte) []byte {
					h.Del(p.sigHeader)
					return b
				})
				r.Method = method
				if a := do(t, r); a.status < 400 {
					t.Errorf("%s %s unsigned: %d (%s), want a refusal", method, target, a.status, a.body)
				}
			}
		}
		// Signed, but to a neighbouring path: not this endpoint, so not
		// passed on either (the sender's URL is wrong: it learns it).
		if !paths[ep.path+"/"] {
			if a := do(t, p.delivery(t, base+ep.path+"/", p.id(300+n), now, p.secrets[0])); a.status != 404 {
				t.Errorf("%s/: a signed delivery to the wrong path: %d, want 404", ep.path, a.status)
			}
		}
	}
	got := l.Received()
	for n, ep := range eps {
		if c := got[recipeCase(t, ep.path).id(100+n)]; c != 1 {
			t.Errorf("%s: the signed delivery reached the backend %d times, want 1", ep.path, c)
		}
	}
	if len(got) != len(eps) {
		t.Errorf("the backend got %v, want only the %d signed deliveries", got, len(eps))
	}
}

// TestServerProviderRecipesGuarded runs the site of docs/providers.md's
// recipes as written.
func TestServerProviderRecipesGuarded(t *testing.T) {
	examples := codeBlocks(docSection(t, "docs/providers.md", "## Recipes"), "caddyfile")
	if len(examples) == 0 {
		t.Fatal("docs/providers.md Recipes: no caddyfile example")
	}
	checkGuardedSite(t, examples[0])
}

// TestServerReadmeTwoSenders runs the README's two-sender site as
// written.
func TestServerReadmeTwoSenders(t *testing.T) {
	checkGuardedSite(t, markedBlock(t, "README.md", "two-senders"))
}

// TestOpenPathWarning: a sangho_dedup with a path matcher beside a
// route that proxies every other request unchecked is warned about at
// load, naming the matcher and a path left open; the guarded shapes are
// not.
func TestOpenPathWarning(t *testing.T) {
	const rp = "reverse_proxy 127.0.0.1:1"
	dedupAt := func(matcher string) string {
		return "\tsangho_dedup " + matcher + " {\n\t\tsecret " + secret1 + "\n\t}\n"
	}
	for _, c := range []struct {
		name, site string
		want       []string // matcher and open path of each warning
	}{
		{"issue 24's shape", dedupAt("/github") + "\t" + rp, []string{"path /github", "/github/"}},
		{"a named matcher", "\t@gh path /github /gh\n" + dedupAt("@gh") + "\t" + rp, []string{"path /github /gh", "/github/"}},
		{"in a route", "\troute {\n" + dedupAt("/hooks/*") + "\t\t" + rp + "\n\t}", []string{"path /hooks/*", "/"}},
		{"behind a handle", "\thandle {\n" + dedupAt("/github") + "\t\t" + rp + "\n\t}", []string{"path /github", "/github/"}},
		{"the proxy has the same matcher", dedupAt("/github") + "\treverse_proxy /github 127.0.0.1:1", nil},
		{"every path matched", dedupAt("/*") + "\t" + rp, nil},
		{"no matcher", dedupAt("") + "\t" + rp, nil},
		{"guarded handle blocks", "\thandle /github {\n" + dedupAt("") + "\t\t" + rp + "\n\t}\n\thandle {\n\t\trespond 404\n\t}", nil},
		{"guarded, the rest proxied by choice", "\thandle /github {\n" + dedupAt("") + "\t\t" + rp + "\n\t}\n\thandle {\n\t\t" + rp + "\n\t}", nil},
		{"answered before the proxy", dedupAt("/github") + "\thandle {\n\t\trespond 404\n\t}\n\t" + rp, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ownDataDir(t)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			cfg := strings.Replace(serverCaddyfile(freePort(t), c.site), "output discard", "output file "+logFile, 1)
			adapted, _ := adaptCaddyfile(t, cfg)
			err := caddyLoad(adapted)
			_ = caddy.Stop()
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range strings.Split(string(b), "\n") {
				var e struct {
					Msg, Matcher, OpenPath string
					Level                  string
				}
				if json.Unmarshal([]byte(l), &struct {
					Msg      *string `json:"msg"`
					Level    *string `json:"level"`
					Matcher  *string `json:"matcher"`
					OpenPath *string `json:"open_path"`
				}{&e.Msg, &e.Level, &e.Matcher, &e.OpenPath}) != nil || e.Msg != "path proxied unchecked" {
					continue
				}
				if e.Level != "warn" {
					t.Errorf("level %q, want warn", e.Level)
				}
				got = append(got, e.Matcher, e.OpenPath)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("warnings (matcher, open path) %q, want %q\n%s", got, c.want, adapted)
			}
		})
	}
}

// TestDocsRedisSiteAdapts: docs/redis.md's site adapts, and proxies only
// behind sangho_dedup: the only reverse_proxy is in the subroute that
// sangho_dedup starts.
func TestDocsRedisSiteAdapts(t *testing.T) {
	adapted, _ := adaptCaddyfile(t, markedBlock(t, "docs/redis.md", "redis-site"))
	dedupAt, proxyAt := strings.Index(adapted, `{"handler":"sangho_dedup"`), strings.Index(adapted, `{"handler":"reverse_proxy"`)
	if strings.Count(adapted, `"handler":"reverse_proxy"`) != 1 || dedupAt < 0 || proxyAt < dedupAt ||
		strings.Contains(adapted[dedupAt:proxyAt], `"match"`) || !strings.Contains(adapted, `"status_code":404`) {
		t.Errorf("docs/redis.md: the proxy is not guarded by sangho_dedup:\n%s", adapted)
	}
}

// TestErrorRouteProxyWarning: a server whose handle_errors routes hold
// reverse_proxy (a failover set up there) is warned at load that they

// errorRouteWarnings loads cfg (JSON) whose log goes to logFile, stops
// Caddy, and counts sangho_dedup's "error routes get no event body"
// warnings in the log, which it returns too.
func errorRouteWarnings(t *testing.T, cfg, logFile string) (int, string) {
	return loadWarnings(t, cfg, logFile, "error routes get no event body")
}

// siteWarnings runs site (with snippet, a named route or a snippet,
// before it) in a Caddy of its own whose log goes to a file, and counts
// sangho_dedup's warnings msg at load, which it returns with the log.
func siteWarnings(t *testing.T, site, snippet, msg string) (int, string) {
	t.Helper()
	ownDataDir(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	cfg := strings.Replace(serverCaddyfile(freePort(t), site), "output discard", "output file "+logFile, 1)
	if snippet != "" {
		cfg = strings.Replace(cfg, "\nhttp://", "\n"+snippet+"http://", 1)
	}
	adapted, _ := adaptCaddyfile(t, cfg)
	return loadWarnings(t, adapted, logFile, msg)
}

// loadWarnings loads cfg (JSON) whose log goes to logFile, stops Caddy,
// and counts sangho_dedup's warnings msg in the log, which it returns
// too.
func loadWarnings(t *testing.T, cfg, logFile, msg string) (int, string) {
	t.Helper()
	err := caddyLoad(cfg)
	_ = caddy.Stop()
	if err != nil {
		t.Fatal(err)
	}
	entries, data := logEntries(t, logFile)
	got := 0
	for _, e := range entries {
		if e["msg"] == msg && e["level"] == "warn" && e["logger"] == "http.handlers.sangho_dedup" {
			got++
		}
	}
	return got, data
}

// get no event body, and told where a fallback goes instead.
func TestErrorRouteProxyWarning(t *testing.T) {
	site := "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t}\n\treverse_proxy 127.0.0.1:1\n"
	for _, c := range []struct {
		name, errors string
		want         bool
	}{
		{"a fallback in handle_errors", "\thandle_errors 5xx {\n\t\treverse_proxy 127.0.0.1:2\n\t}", true},
		{"php_fastcgi in handle_errors", "\thandle_errors {\n\t\tphp_fastcgi 127.0.0.1:9000\n\t}", true},
		{"handle_errors that answers", "\thandle_errors {\n\t\trespond \"{http.error.status_code}\"\n\t}", false},
		{"handle_errors invoking a named route that proxies", "\thandle_errors {\n\t\tinvoke fallback\n\t}", true},
		{"no handle_errors", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			snippet := ""
			if strings.Contains(c.errors, "invoke fallback") {
				snippet = "&(fallback) {\n\treverse_proxy 127.0.0.1:2\n}\n"
			}
			got, data := siteWarnings(t, site+c.errors, snippet, "error routes get no event body")
			if want := map[bool]int{true: 1, false: 0}[c.want]; got != want {
				t.Errorf("%d warnings, want %d:\n%s", got, want, data)
			}
		})
	}
}

// A JSON subroute's own error routes run with the request the way the
// server's do: a subroute holding sangho_dedup whose errors proxy is
// warned about too.
func TestSubrouteErrorRouteProxyWarning(t *testing.T) {
	for _, c := range []struct {
		name, errorHandler string
		want               bool
	}{
		{"a fallback in the subroute's errors", `{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:2"}]}`, true},
		{"errors in a nested subroute", `{"handler":"subroute","routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:2"}]}]}]}`, true},
		{"the subroute's errors answer", `{"handler":"static_response","status_code":502}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ownDataDir(t)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			site := "\troute {\n\t\tsangho_dedup {\n\t\t\tsecret " + secret1 + "\n\t\t}\n\t\treverse_proxy 127.0.0.1:1\n\t}\n"
			adapted, _ := adaptCaddyfile(t, strings.Replace(serverCaddyfile(freePort(t), site), "output discard", "output file "+logFile, 1))
			var cfg map[string]any
			if err := json.Unmarshal([]byte(adapted), &cfg); err != nil {
				t.Fatal(err)
			}
			var errorHandler any
			if err := json.Unmarshal([]byte(c.errorHandler), &errorHandler); err != nil {
				t.Fatal(err)
			}
			// The subroute that holds sangho_dedup gets error routes.
			found := 0
			var walk func(v any)
			walk = func(v any) {
				switch v := v.(type) {
				case map[string]any:
					if v["handler"] == "subroute" && strings.Contains(fmt.Sprint(v["routes"]), "sangho_dedup") {
						if _, ok := v["errors"]; !ok && found == 0 {
							v["errors"] = map[string]any{"routes": []any{map[string]any{"handle": []any{errorHandler}}}}
							found++
							return
						}
					}
					for _, e := range v {
						walk(e)
					}
				case []any:
					for _, e := range v {
						walk(e)
					}
				}
			}
			walk(cfg)
			if found != 1 {
				t.Fatalf("no subroute holding sangho_dedup in %s", adapted)
			}
			raw, _ := json.Marshal(cfg)
			got, data := errorRouteWarnings(t, string(raw), logFile)
			if want := map[bool]int{true: 1, false: 0}[c.want]; got != want {
				t.Errorf("%d warnings, want %d:\n%s", got, want, data)
			}
		})
	}
}

// TestUnreachedHandlerWarns: a sangho_dedup after a handler that answers
// every request (reverse_proxy without handle_response, respond, error,
// file_server without pass_thru), in the same route list, is never
// reached: unsigned and repeated deliveries go to the backend as they
// come. Caddy accepts it (route { reverse_proxy …; sangho_dedup … }, or
// the global option order sangho_dedup last); the handler warns at load
// (found by the configuration review: no word). Before its backend's
// handler, after forward_auth (a reverse_proxy with handle_response),
// or after a route with a matcher, it does not.
func TestUnreachedHandlerWarns(t *testing.T) {
	dedup := "sangho_dedup {\n\t\t\tsecret " + secret1 + "\n\t\t\tstore memory\n\t\t}"
	for _, c := range []struct {
		name, site string
		warn       bool
	}{
		{"route, proxy first", "\troute {\n\t\treverse_proxy 127.0.0.1:9\n\t\t" + dedup + "\n\t}\n", true},
		{"route, respond first", "\troute {\n\t\trespond 200\n\t\t" + dedup + "\n\t}\n", true},
		{"order sangho_dedup last", "\t" + dedup + "\n\treverse_proxy 127.0.0.1:9\n", true},
		{"the usual order", "\t" + dedup + "\n\treverse_proxy 127.0.0.1:9\n", false},
		{"forward_auth first", "\troute {\n\t\tforward_auth 127.0.0.1:9 {\n\t\t\turi /auth\n\t\t}\n\t\t" + dedup + "\n\t\treverse_proxy 127.0.0.1:9\n\t}\n", false},
		{"a matched proxy first", "\troute {\n\t\treverse_proxy /other 127.0.0.1:9\n\t\t" + dedup + "\n\t\treverse_proxy 127.0.0.1:9\n\t}\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ownDataDir(t)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			cfg := strings.Replace(serverCaddyfile(freePort(t), c.site), "output discard", "output file "+logFile, 1)
			if c.name == "order sangho_dedup last" {
				cfg = strings.Replace(cfg, "\tadmin off\n", "\tadmin off\n\torder sangho_dedup last\n", 1)
			}
			adapted, _ := adaptCaddyfile(t, cfg)
			n, data := loadWarnings(t, adapted, logFile, "sangho_dedup never reached")
			if c.warn && n != 1 || !c.warn && n != 0 {
				t.Errorf("%d warnings, want warned %v; log:\n%s", n, c.warn, data)
			}
		})
	}
}
