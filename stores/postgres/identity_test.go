package postgres_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// twoSites is a Caddyfile of two site blocks, shop and billing, with
// secrets of their own, each on the postgres store with its own DSN
// (and extra options), each in front of its own backend.
func twoSites(adminPort, portShop, portBilling int, dsnShop, dsnBilling, extraShop, extraBilling, backendShop, backendBilling string) string {
	site := func(port int, name, secret, dsn, extra, backend string) string {
		return fmt.Sprintf(`http://127.0.0.1:%d {
	bind 127.0.0.1
	sangho_dedup {
		name %s
		secret %s
		store postgres {
			dsn "%s"
		}
		%s
	}
	reverse_proxy %s
}
`, port, name, secret, dsn, extra, backend)
	}
	return fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\n", adminPort) +
		site(portShop, "shop", secretShop, dsnShop, extraShop, backendShop) +
		site(portBilling, "billing", secretBilling, dsnBilling, extraBilling, backendBilling)
}

const (
	secretShop    = "whsec_identity_shop"
	secretBilling = "whsec_identity_billing"
)

// deliverToBoth sends the event id, signed, to shop and to billing, and
// fails unless both answer 200.
func deliverToBoth(t *testing.T, portShop, portBilling int, id string) {
	t.Helper()
	site := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d/webhook", port) }
	handlertest.DeliverAll(t, client, id, `{"id":"`+id+`","type":"invoice.paid"}`,
		handlertest.Target{URL: site(portShop), Secret: secretShop}, handlertest.Target{URL: site(portBilling), Secret: secretBilling})
}

// TestServerOneTableTwoDSNSpellings: two site blocks, shop and billing,
// with different secrets and the default key_prefix, each reaching the
// default table of one PostgreSQL server through a DSN spelled its own
// way, are refused at load like any two endpoints that share a store.
// (Found by review: the store's identity was the DSN as written, so a
// DSN without the database name and one with it, or the Unix socket and
// 127.0.0.1, were two stores; Caddy started, and the event shop
// processed was answered "200 duplicate" by billing, whose backend never
// saw it.) With a key_prefix each, both backends get the event once.
func TestServerOneTableTwoDSNSpellings(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "pgsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if err := os.Chmod(sockDir, 0o777); err != nil { // the server may run as another user
		t.Fatal(err)
	}
	srv := pgtest.Start(t, "unix_socket_directories = '"+sockDir+"'")
	port := strconv.Itoa(srv.Port)
	for i, c := range []struct{ name, shop, billing string }{
		// libpq's database defaults to the user's name
		{"database left out", "postgres://postgres@127.0.0.1:" + port + "?sslmode=disable",
			"postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable"},
		{"Unix socket and 127.0.0.1", "host=" + sockDir + " port=" + port + " user=postgres dbname=postgres",
			"postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable"},
		{"Unix socket and localhost, database left out", "postgres://postgres@/postgres?host=" + sockDir + "&port=" + port,
			"postgres://postgres@localhost:" + port + "?sslmode=disable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			shop, billing := ledger.New(t), ledger.New(t)
			adminPort, portShop, portBilling := freePort(t), freePort(t), freePort(t)
			loadErr := func(extraShop, extraBilling string) error {
				cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(twoSites(adminPort, portShop, portBilling,
					c.shop, c.billing, extraShop, extraBilling, shop.Addr, billing.Addr)), nil)
				if err != nil {
					t.Fatalf("adapting: %v %v", err, warn)
				}
				return caddy.Load(cfg, true)
			}
			deliver := func(id string) { deliverToBoth(t, portShop, portBilling, id) }
			t.Cleanup(func() { _ = caddy.Stop() })

			err := loadErr("", "")
			if err == nil {
				deliver("evt_swallowed")
				_, s := shop.Counts("evt_swallowed")
				_, b := billing.Counts("evt_swallowed")
				t.Fatalf("two site blocks with different secrets on one table and key_prefix loaded; one event to both: shop's backend processed it %d times, billing's %d times", s, b)
			}
			if !strings.Contains(err.Error(), "key_prefix") || strings.Contains(err.Error(), secretBilling) {
				t.Fatalf("error: %v", err)
			}

			if err := loadErr("key_prefix shop:", "key_prefix billing:"); err != nil {
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

// A pool opened while PostgreSQL was down names the table by its DSN.
// Once the server answers, a reload asks it again, so that an endpoint
// whose pool was opened meanwhile (named by the server) is compared
// with it the same way. (Found by review: the DSN's name was kept for
// the pool's life; a reload that put billing, on a new pool, on shop's
// table and key_prefix loaded, and billing's event was answered "200
// duplicate" without reaching its backend.)
func TestServerIdentityAskedAgainOnceTheServerAnswers(t *testing.T) {
	srv := pgtest.Start(t)
	srv.Stop(t)
	port := strconv.Itoa(srv.Port)
	dsnShop := "postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable"
	dsnBilling := "postgres://postgres@localhost:" + port + "/postgres?sslmode=disable"
	shop, billing := ledger.New(t), ledger.New(t)
	adminPort, portShop, portBilling := freePort(t), freePort(t), freePort(t)
	loadErr := func(dsnBilling, extraBilling string) error {
		cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(twoSites(adminPort, portShop, portBilling,
			dsnShop, dsnBilling, "", extraBilling, shop.Addr, billing.Addr)), nil)
		if err != nil {
			t.Fatalf("adapting: %v %v", err, warn)
		}
		return caddy.Load(cfg, true)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	// Caddy starts while PostgreSQL is down; billing has a prefix of its own.
	if err := loadErr(dsnBilling, "key_prefix billing:"); err != nil {
		t.Fatal(err)
	}
	srv.Ctl(t, "start")
	// The reload puts billing on shop's key_prefix, through a pool of
	// its own (another DSN), named by the server; shop keeps its pool.
	err := loadErr(dsnBilling+"&application_name=billing", "")
	if err == nil {
		id := "evt_swallowed"
		deliverToBoth(t, portShop, portBilling, id)
		_, s := shop.Counts(id)
		_, b := billing.Counts(id)
		t.Fatalf("a reload put two endpoints with different secrets on one table and key_prefix; one event to both: shop's backend processed it %d times, billing's %d times", s, b)
	}
	if !strings.Contains(err.Error(), "key_prefix") || strings.Contains(err.Error(), secretBilling) {
		t.Fatalf("error: %v", err)
	}
}
