package postgres

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`postgres {
		dsn "postgres://caddy:{env.PGPASSWORD}@db:5432/app?sslmode=verify-full"
		table app.events
		max_conns 20
		create_table off
		statement_timeout 2s
		cleanup_interval 30s
		local_cache 5000
	}`)
	var s Store
	if err := s.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if s.DSN != "postgres://caddy:{env.PGPASSWORD}@db:5432/app?sslmode=verify-full" || s.Table != "app.events" || s.MaxConns != 20 ||
		s.CreateTable == nil || *s.CreateTable || s.StatementTimeout != caddy.Duration(2*time.Second) || s.CleanupInterval != caddy.Duration(30*time.Second) || s.LocalCache != 5000 {
		t.Fatalf("parsed %+v", s)
	}
}

// Every error names the option it is about.
func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for in, want := range map[string]string{
		"postgres extra":                            "takes no value on its line (write dsn <dsn> in its block)",
		"postgres {\n nope 1\n}":                    `unrecognized postgres store subdirective (not shown`,
		"postgres {\n dns x\n}":                     `unrecognized postgres store subdirective (not shown: it is no option's name`,
		"postgres {\n dsn a\n dsn b\n}":             "dsn given more than once",
		"postgres {\n dsn\n}":                       "dsn has no value",
		"postgres {\n table 1abc\n}":                "table:",
		"postgres {\n table a.b.c\n}":               "table:",
		"postgres {\n table \"x; DROP TABLE y\"\n}": "table:",
		"postgres {\n max_conns 0\n}":               `max_conns: must be 1 to 10000, not "0"`,
		"postgres {\n max_conns -1\n}":              `max_conns: must be 1 to 10000, not "-1"`,
		"postgres {\n max_conns 10001\n}":           `max_conns: must be 1 to 10000, not "10001"`,
		"postgres {\n max_conns many\n}":            `max_conns: must be 1 to 10000, not "many"`,
		"postgres {\n create_table yes\n}":          "create_table:",
		"postgres {\n statement_timeout soon\n}":    "statement_timeout:",
		"postgres {\n cleanup_interval -1s\n}":      "cleanup_interval:",
		"postgres {\n statement_timeout 1s 2s\n}":   "statement_timeout: takes one value",
		// PostgreSQL refuses over 2^31-1 ms at every connection: every
		// delivery failed (found by review). Bounded as Redis's timeouts.
		"postgres {\n statement_timeout 30d\n}": "statement_timeout:",
		"postgres {\n statement_timeout 61m\n}": "statement_timeout:",
		"postgres {\n local_cache lots\n}":      "local_cache:",
		"postgres {\n local_cache -1\n}":        `local_cache: must be a number of entries or off, not "-1"`,
	} {
		var s Store
		err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error with %q", in, err, want)
		}
	}
}

// local_cache 0 is off, as off is, and as 0 is in JSON and for Redis.
func TestUnmarshalCaddyfileLocalCacheZeroIsOff(t *testing.T) {
	s := Store{LocalCache: 5}
	if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("postgres {\n local_cache 0\n}")); err != nil || s.LocalCache != 0 {
		t.Fatalf("local_cache 0: %v, cache %d; want off", err, s.LocalCache)
	}
}

// Options checked at provisioning (as from JSON) name the option.
func TestResolveErrors(t *testing.T) {
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{Table: "bad-name"}, "table:"},
		{Store{MaxConns: -1}, "max_conns:"},
		{Store{LocalCache: -1}, "local_cache:"},
		{Store{StatementTimeout: caddy.Duration(time.Microsecond)}, "statement_timeout:"},
		{Store{StatementTimeout: caddy.Duration(30 * 24 * time.Hour)}, "statement_timeout:"},
		{Store{CleanupInterval: caddy.Duration(time.Millisecond)}, "cleanup_interval:"},
		{Store{DSN: "postgres://h/db?sslmode=bogus"}, "dsn:"},
	} {
		_, err := c.s.resolve()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want %q", c.s, err, c.want)
		}
	}
}

// DataID names host and port (one spelling for loopback), database and
// table (public when unqualified), whatever the other settings.
func TestDataID(t *testing.T) {
	id := func(s Store) string {
		t.Helper()
		o, err := s.resolve()
		if err != nil {
			t.Fatal(err)
		}
		return o.stateID()
	}
	a := id(Store{DSN: "postgres://u:p@127.0.0.1:5432/app"})
	for _, same := range []Store{
		{DSN: "postgres://other@LOCALHOST/app?sslmode=disable", Table: "public.processed_webhook_events", MaxConns: 3},
		{DSN: "host=::1 port=5432 dbname=app user=x", Table: "PROCESSED_WEBHOOK_EVENTS"},
	} {
		if b := id(same); b != a {
			t.Errorf("%q != %q", b, a)
		}
	}
	if a != "postgres localhost:5432 db app table public.processed_webhook_events" {
		t.Errorf("state ID = %q", a)
	}
	for _, other := range []Store{
		{DSN: "postgres://u:p@127.0.0.1:5433/app"},
		{DSN: "postgres://u:p@127.0.0.1:5432/app2"},
		{DSN: "postgres://u:p@127.0.0.1:5432/app", Table: "app.processed_webhook_events"},
		{DSN: "postgres://u:p@db.example:5432/app"},
	} {
		if b := id(other); b == a {
			t.Errorf("%+v has the same state ID", other)
		}
	}
}
