package sanghodedup

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
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
