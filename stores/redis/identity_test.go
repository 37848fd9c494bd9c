package redis_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sangho/caddy-sangho-dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

const (
	secretShop    = "whsec_redis_identity_shop"
	secretBilling = "whsec_redis_identity_billing"
)

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// twoSites is a Caddyfile of two site blocks, shop and billing, with
// secrets of their own, each with its own store block and options, each
// in front of its own backend.
func twoSites(adminPort, portShop, portBilling int, storeShop, storeBilling, extraShop, extraBilling, backendShop, backendBilling string) string {
	site := func(port int, name, secret, store, extra, backend string) string {
		return fmt.Sprintf(`http://127.0.0.1:%d {
	bind 127.0.0.1
	sangho_dedup {
		name %s
		secret %s
		store redis {
			%s
			dial_timeout 500ms
			read_timeout 1s
		}
		%s
	}
	reverse_proxy %s
}
`, port, name, secret, store, extra, backend)
	}
	return fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\n", adminPort) +
		site(portShop, "shop", secretShop, storeShop, extraShop, backendShop) +
		site(portBilling, "billing", secretBilling, storeBilling, extraBilling, backendBilling)
}

// deliverToBoth sends the event id, signed, to shop and to billing, and
// fails unless both answer 200.
func deliverToBoth(t *testing.T, portShop, portBilling int, id string) {
	t.Helper()
	site := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d/webhook", port) }
	handlertest.DeliverAll(t, client, id, `{"id":"`+id+`","type":"invoice.paid"}`,
		handlertest.Target{URL: site(portShop), Secret: secretShop}, handlertest.Target{URL: site(portBilling), Secret: secretBilling})
}

// TestServerOneRedisTwoAddressLists: two site blocks, shop and billing,
// with different secrets and the default key_prefix, on one Redis
// Cluster through different (even disjoint) lists of its nodes, or on
// one Sentinel-monitored master through different Sentinels, are
// refused at load like any two endpoints that share a store. (Found by
// review: the store's identity was the address list as written, so one
// Cluster listed two ways was two stores; Caddy started, and the event
// shop processed was answered "200 duplicate" by billing, whose backend
// never saw it.) With a key_prefix each, both backends get the event
// once.
func TestServerOneRedisTwoAddressLists(t *testing.T) {
	addresses := func(addrs ...string) string { return "address " + strings.Join(addrs, " ") }
	type spelling struct{ name, shop, billing string }
	var cases []spelling
	c := redistest.StartCluster(t)
	n := c.Addrs()
	cases = append(cases,
		spelling{"Cluster, disjoint seed nodes", addresses(n[0], n[1], n[2]), addresses(n[3], n[4], n[5])},
		spelling{"Cluster, one seed node with cluster, and the others", addresses(n[5]) + "\n\t\t\tcluster", addresses(n[0], n[1], n[2], n[3], n[4])},
	)
	st := redistest.StartSentinel(t)
	s := st.SentinelAddrs()
	sentinel := func(addrs ...string) string {
		return addresses(addrs...) + "\n\t\t\tmaster_name " + redistest.MasterName
	}
	cases = append(cases,
		spelling{"Sentinels in another order", sentinel(s[0], s[1], s[2]), sentinel(s[2], s[1], s[0])},
		spelling{"disjoint Sentinels", sentinel(s[0]), sentinel(s[1], s[2])},
		spelling{"Sentinels and their master", sentinel(s[0], s[1], s[2]), addresses(st.Master.Addr)},
	)

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			shop, billing := ledger.New(t), ledger.New(t)
			adminPort, portShop, portBilling := netkit.FreePort(t), netkit.FreePort(t), netkit.FreePort(t)
			load := func(extraShop, extraBilling string) error {
				cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(twoSites(adminPort, portShop, portBilling,
					c.shop, c.billing, extraShop, extraBilling, shop.Addr, billing.Addr)), nil)
				if err != nil {
					t.Fatalf("adapting: %v %v", err, warn)
				}
				return caddy.Load(cfg, true)
			}
			deliver := func(id string) { deliverToBoth(t, portShop, portBilling, id) }
			t.Cleanup(func() { _ = caddy.Stop() })

			err := load("", "")
			if err == nil {
				id := "evt_swallowed_" + strconv.Itoa(i)
				deliver(id)
				_, s := shop.Counts(id)
				_, b := billing.Counts(id)
				t.Fatalf("two site blocks with different secrets on one Redis and key_prefix loaded; one event to both: shop's backend processed it %d times, billing's %d times", s, b)
			}
			if !strings.Contains(err.Error(), "key_prefix") || strings.Contains(err.Error(), secretBilling) {
				t.Fatalf("error: %v", err)
			}

			if err := load("key_prefix shop:", "key_prefix billing:"); err != nil {
				t.Fatalf("with a key_prefix each: %v", err)
			}
			id := "evt_both_" + strconv.Itoa(i)
			deliver(id)
			deliver(id)
			for name, l := range map[string]*ledger.Ledger{"shop": shop, "billing": billing} {
				if _, done := l.Counts(id); done != 1 {
					t.Errorf("%s's backend processed the event %d times, want 1", name, done)
				}
			}
		})
	}
}

// A client opened while its Sentinels were down names the store by its
// addresses. Once they answer, a reload asks them again, so that an
// endpoint on the master they name (addressed directly) is compared
// with it the same way. (Found by review of the PostgreSQL store, which
// had the same flaw: the addresses' name was kept for the client's
// life; a reload that put billing on shop's master and key_prefix
// loaded, and billing's event was answered "200 duplicate" without
// reaching its backend.)
func TestServerIdentityAskedAgainOnceSentinelsAnswer(t *testing.T) {
	st := redistest.StartSentinel(t)
	sentinel := st.Sentinels[0]
	storeShop := "address " + sentinel.Addr + "\n\t\t\tmaster_name " + redistest.MasterName
	storeBilling := "address " + st.Master.Addr
	shop, billing := ledger.New(t), ledger.New(t)
	adminPort, portShop, portBilling := netkit.FreePort(t), netkit.FreePort(t), netkit.FreePort(t)
	load := func(extraBilling string) error {
		cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(twoSites(adminPort, portShop, portBilling,
			storeShop, storeBilling, "", extraBilling, shop.Addr, billing.Addr)), nil)
		if err != nil {
			t.Fatalf("adapting: %v %v", err, warn)
		}
		return caddy.Load(cfg, true)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	// Caddy starts while shop's Sentinel is down; billing has a prefix of its own.
	sentinel.Kill()
	if err := load("key_prefix billing:"); err != nil {
		t.Fatal(err)
	}
	sentinel.Restart(t)
	// The reload puts billing on shop's key_prefix; shop keeps its client.
	err := load("")
	if err == nil {
		id := "evt_swallowed"
		deliverToBoth(t, portShop, portBilling, id)
		_, s := shop.Counts(id)
		_, b := billing.Counts(id)
		t.Fatalf("a reload put two endpoints with different secrets on one Redis and key_prefix; one event to both: shop's backend processed it %d times, billing's %d times", s, b)
	}
	if !strings.Contains(err.Error(), "key_prefix") || strings.Contains(err.Error(), secretBilling) {
		t.Fatalf("error: %v", err)
	}
}
