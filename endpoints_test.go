package sanghodedup

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

// The registry of endpoints spans the whole loaded config: every server
// (site block) and every route, not one server at a time. Caddy gives
// each server a context of its own; these tests put the handlers in
// different servers.

// twoSites is a Caddyfile with one sangho_dedup endpoint in each of two
// site blocks (two servers), the admin API at admin.
func twoSites(admin string, portA, portB int, a, b string) string {
	site := func(port int, body string) string {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\tbind 127.0.0.1\n%s\n}\n", port, body)
	}
	return fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\n", admin) +
		site(portA, a) + site(portB, b)
}

func siteEndpoint(secret, options, backend string) string {
	return fmt.Sprintf("\tsangho_dedup {\n\t\tsecret %s\n\t\t%s\n\t}\n\treverse_proxy %s", secret, options, backend)
}

// Two site blocks on the default store with different secrets and no
// key_prefix would swallow each other's events (the review's case: the
// second site answered "duplicate" and its backend never saw the
// event). The config is refused, naming the fix, on every store.
func TestServerTwoSiteBlocksSharingStateNeedDistinctPrefixes(t *testing.T) {
	r := startRedis(t)
	for name, store := range map[string]string{
		"default": "",
		"memory":  "store memory",
		"redis":   redisStoreLine(r.Addr),
	} {
		t.Run(name, func(t *testing.T) {
			ownDataDir(t)
			src := twoSites("off", freePort(t), freePort(t),
				siteEndpoint(secret1, store, "127.0.0.1:1"), siteEndpoint(secret2, store, "127.0.0.1:1"))
			cfg, _ := adaptCaddyfile(t, src)
			err := caddyLoad(cfg)
			defer caddy.Stop()
			if err == nil {
				t.Fatal("two site blocks on one store and prefix, with different secrets, loaded")
			}
			if !strings.Contains(err.Error(), "key_prefix") || strings.Contains(err.Error(), secret2) {
				t.Errorf("error: %v", err)
			}
		})
	}
}

// The same in a JSON config with two servers, as an operator who writes
// JSON would have it.
func TestServerTwoJSONServersSharingStateNeedDistinctPrefixes(t *testing.T) {
	ownDataDir(t)
	server := func(port int, secret string) string {
		return fmt.Sprintf(`{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
			{"handler":"sangho_dedup","secret":[%q],"store":{"type":"memory"}},
			{"handler":"static_response","status_code":200}]}]}`, port, secret)
	}
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"a":%s,"b":%s}}}}`,
		server(freePort(t), secret1), server(freePort(t), secret2))
	err := caddyLoad(cfg)
	defer caddy.Stop()
	if err == nil || !strings.Contains(err.Error(), "key_prefix") {
		t.Fatalf("two JSON servers on one memory store and prefix with different secrets: %v", err)
	}
}

// With a key_prefix each, the two sites both get the event once, and the
// admin API lists both endpoints (it listed the last server's only);
// a name given to two handlers with different prefixes in two sites is
// refused; a reload that removes a site removes it from the list, one
// that adds it back lists it again.
func TestServerTwoSiteBlocksAreTwoEndpoints(t *testing.T) {
	ownDataDir(t)
	la, lb := ledger.New(t), ledger.New(t)
	admin := "127.0.0.1:" + strconv.Itoa(freePort(t))
	portA, portB := freePort(t), freePort(t)
	prefix := testPrefix(t)
	alpha := siteEndpoint(secret1, "name alpha\n\t\tkey_prefix "+prefix+"_a:", la.Addr)
	beta := siteEndpoint(secret2, "name beta\n\t\tkey_prefix "+prefix+"_b:", lb.Addr)
	load := func(src string) error {
		cfg, _ := adaptCaddyfile(t, src)
		return caddyLoad(cfg)
	}
	if err := load(twoSites(admin, portA, portB, alpha, beta)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	for range 3 {
		for port, secret := range map[int]string{portA: secret1, portB: secret2} {
			if a := sendWith(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/webhook", bodyA, secret); a.status != 200 {
				t.Fatalf("delivery to :%d: %d %s", port, a.status, a.body)
			}
		}
	}
	for name, l := range map[string]*ledger.Ledger{"alpha": la, "beta": lb} {
		if n, _ := l.Counts(""); n != 1 {
			t.Errorf("%s's backend got the event %d times, want 1", name, n)
		}
	}
	// Listed through the command's client: right after a reload a
	// request can land on the admin server being replaced (see adminDo).
	client, base, origin, err := adminClient(admin)
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		t.Helper()
		status, body, err := adminDo(client, base, origin, http.MethodGet, "/sangho_dedup/")
		if err != nil || status != http.StatusOK {
			t.Fatalf("GET /sangho_dedup/: %d %s %v", status, body, err)
		}
		var list []EndpointInfo
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range list {
			n = append(n, e.Name)
		}
		slices.Sort(n)
		return n
	}
	if got := names(); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Errorf("GET /sangho_dedup/ lists %v, want [alpha beta]", got)
	}
	as := &adminServer{admin: admin}
	if code, out, err := as.cli(t, "get", "evt_1QZtest000000000001", "name", "alpha"); code != 0 {
		t.Errorf("caddy sangho-dedup get --name alpha: exit %d, %s %v", code, out, err)
	}

	// a name used twice across sites, with different prefixes
	clash := siteEndpoint(secret2, "name alpha\n\t\tkey_prefix "+prefix+"_b:", lb.Addr)
	if err := load(twoSites(admin, portA, portB, alpha, clash)); err == nil || !strings.Contains(err.Error(), `named "alpha"`) {
		t.Errorf("two sites naming different prefixes alpha: %v", err)
	}

	// a reload without beta, then with it again
	one := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\nhttp://127.0.0.1:%d {\n\tbind 127.0.0.1\n%s\n}\n", admin, portA, alpha)
	if err := load(one); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"alpha"}) {
		t.Errorf("after a reload without beta: %v", got)
	}
	if err := load(twoSites(admin, portA, portB, alpha, beta)); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Errorf("after a reload with beta again: %v", got)
	}
}

// Every site of one Caddy shares the default file (one per Caddy, in its
// data directory). Two named sites on it with different secrets and no
// key_prefix are refused, and the error names both endpoints, says the
// file is shared by every site, which endpoint to leave as it is (its
// records are stored under its prefix) and the key_prefix line to write
// in the other. (The error said "give each endpoint its own key_prefix"
// and nothing of the records.)
func TestServerTwoNamedSitesOnTheDefaultFileNameTheFix(t *testing.T) {
	ownDataDir(t)
	src := twoSites("off", freePort(t), freePort(t),
		siteEndpoint(secret1, "name shop", "127.0.0.1:1"), siteEndpoint(secret2, "name billing", "127.0.0.1:1"))
	cfg, _ := adaptCaddyfile(t, src)
	err := caddyLoad(cfg)
	defer caddy.Stop()
	if err == nil {
		t.Fatal("two named sites on the default file, with different secrets and no key_prefix, loaded")
	}
	for _, want := range []string{`"shop"`, `"billing"`, "shared by every site of this Caddy", "records", `key_prefix sangho_dedup:billing:`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), secret1) || strings.Contains(err.Error(), secret2) {
		t.Errorf("the error shows a secret: %v", err)
	}
}

// A `name` does not change the key_prefix: an endpoint with a name and no
// key_prefix stores under the default prefix, as it always has. So the
// records an existing config stored (here an unnamed endpoint, as most
// configs run today) are still duplicates after the endpoint is named and
// a second site with a key_prefix of its own is added beside it; deriving
// a prefix from the name would have processed every retained event again.
func TestServerNamedEndpointKeepsTheDefaultPrefix(t *testing.T) {
	ownDataDir(t)
	file := filepath.Join(t.TempDir(), "dedup.db")
	store := "store file " + file
	before := ledger.New(t)
	port := freePort(t)
	cfg, _ := adaptCaddyfile(t, serverCaddyfile(port, dedupSite(before.Addr, store)))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	if a := sendWith(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/webhook", bodyA, secret1); a.status != 200 || a.dedup != "" {
		t.Fatalf("first delivery: %d %q", a.status, a.dedup)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	shop, billing := ledger.New(t), ledger.New(t)
	portA, portB := freePort(t), freePort(t)
	cfg, _ = adaptCaddyfile(t, twoSites("off", portA, portB,
		siteEndpoint(secret1, store+"\n\t\tname shop", shop.Addr),
		siteEndpoint(secret2, store+"\n\t\tname billing\n\t\tkey_prefix sangho_dedup:billing:", billing.Addr)))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	if a := sendWith(t, "http://127.0.0.1:"+strconv.Itoa(portA)+"/webhook", bodyA, secret1); a.status != 200 || a.dedup != "duplicate" {
		t.Errorf("the event stored before, to the named endpoint: %d %q, want 200 duplicate", a.status, a.dedup)
	}
	if a := sendWith(t, "http://127.0.0.1:"+strconv.Itoa(portB)+"/webhook", bodyA, secret2); a.status != 200 || a.dedup != "" {
		t.Errorf("the event to the new site: %d %q, want it processed", a.status, a.dedup)
	}
	if n, _ := shop.Counts(""); n != 0 {
		t.Errorf("the named endpoint's backend got the stored event %d times, want 0", n)
	}
	if n, _ := billing.Counts(""); n != 1 {
		t.Errorf("the new site's backend got the event %d times, want 1", n)
	}
}

// The two-site recipe of docs/configuration.md ("One endpoint, one
// prefix"), run as written but for the addresses: it loads on the
// default file, each site's backend gets the event once, and the shop's
// records stay under the default prefix.
func TestDocsTwoSitesOnTheDefaultFile(t *testing.T) {
	ownDataDir(t)
	blocks := codeBlocks(docSection(t, "docs/configuration.md", "## One endpoint, one prefix"), "caddyfile")
	if len(blocks) != 1 {
		t.Fatalf("docs/configuration.md's One endpoint, one prefix has %d caddyfile blocks, want 1", len(blocks))
	}
	t.Setenv("SHOP_WEBHOOK_SECRET", secret1)
	t.Setenv("BILLING_WEBHOOK_SECRET", secret2)
	shop, billing := ledger.New(t), ledger.New(t)
	portA, portB := freePort(t), freePort(t)
	src := strings.NewReplacer(
		"shop.example.com {", fmt.Sprintf("http://127.0.0.1:%d {\n\tbind 127.0.0.1", portA),
		"billing.example.com {", fmt.Sprintf("http://127.0.0.1:%d {\n\tbind 127.0.0.1", portB),
		"localhost:8080", shop.Addr,
		"localhost:8081", billing.Addr,
	).Replace(blocks[0])
	if !strings.Contains(src, shop.Addr) || !strings.Contains(src, billing.Addr) || !strings.Contains(src, "127.0.0.1:"+strconv.Itoa(portB)) {
		t.Fatalf("the recipe changed shape; the test's replacements no longer apply:\n%s", blocks[0])
	}
	cfg, _ := adaptCaddyfile(t, "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\n"+src)
	if err := caddyLoad(cfg); err != nil {
		t.Fatalf("the recipe does not load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	for range 2 {
		for port, secret := range map[int]string{portA: secret1, portB: secret2} {
			if a := sendWith(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/webhook", bodyA, secret); a.status != 200 {
				t.Fatalf("delivery to :%d: %d %s", port, a.status, a.body)
			}
		}
	}
	for name, l := range map[string]*ledger.Ledger{"shop": shop, "billing": billing} {
		if n, _ := l.Counts(""); n != 1 {
			t.Errorf("%s's backend got the event %d times, want 1", name, n)
		}
	}
	eps := currentEndpoints()
	if eps["shop"] == nil || eps["shop"].KeyPrefix != DefaultKeyPrefix || eps["billing"] == nil || eps["billing"].KeyPrefix != "sangho_dedup:billing:" {
		t.Errorf("endpoints: %v", eps)
	}
}

// Two endpoints on one store whose key_prefixes overlap, one the other
// followed by what may begin an event ID (or "sig:" and hex, a signature
// record's key), share keys: with key_prefix a: and a:sig:, an event ID
// of 64 hex digits under the second is the first one's signature record;
// with pay and pay_2, event _2x under the first is event x under the
// second. One endpoint's events would be answered as the other's
// duplicates, never reaching its backend. Such a config is refused,
// naming both prefixes; prefixes that part at a ':' (a: and a:b:, the
// docs' scheme) are not.
func TestServerOverlappingKeyPrefixesRefused(t *testing.T) {
	for _, c := range []struct {
		a, b    string
		refused bool
	}{
		{"a:", "a:sig:", true},
		{"a:", "a:sig:0f", true},
		{"pay", "pay_2", true},
		{"a:", "a:evt_", true},
		{"a:", "a:b:", false},
		{"a:", "a:sig:x:", false},
		{"a:", "b:", false},
		{"a:", "a:sig:xyz", false}, // not hex: no signature record's key
	} {
		t.Run(c.a+" "+c.b, func(t *testing.T) {
			ownDataDir(t)
			src := twoSites("off", freePort(t), freePort(t),
				siteEndpoint(secret1, "key_prefix "+c.a+"\n\t\tstore memory", "127.0.0.1:1"),
				siteEndpoint(secret2, "key_prefix "+c.b+"\n\t\tstore memory", "127.0.0.1:1"))
			cfg, _ := adaptCaddyfile(t, src)
			err := caddyLoad(cfg)
			defer caddy.Stop()
			switch {
			case c.refused && err == nil:
				t.Fatal("loaded; want the config refused")
			case c.refused && (!strings.Contains(err.Error(), strconv.Quote(c.a)) || !strings.Contains(err.Error(), strconv.Quote(c.b)) || !strings.Contains(err.Error(), "overlap")):
				t.Errorf("error %v; want it to name both prefixes and say they overlap", err)
			case !c.refused && err != nil:
				t.Errorf("refused: %v", err)
			}
		})
	}
}
