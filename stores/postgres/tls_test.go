package postgres

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// TLS through the DSN: sslmode=verify-full against a private CA, with a
// client certificate the server requires (clientcert=verify-full: its
// common name is the role). Every operation works; trusting another CA,
// leaving the client certificate out, or no TLS at all is refused.
func TestTLSClientCertificate(t *testing.T) {
	certs := pgtest.GenerateTLS(t, "caddy")
	files, settings := certs.ServerFiles(t)
	srv := pgtest.StartWith(t, pgtest.Options{Settings: settings, Files: files, HBA: []string{
		"hostnossl all postgres 127.0.0.1/32 trust",
		"hostssl all caddy 127.0.0.1/32 trust clientcert=verify-full",
	}})
	srv.Psql(t, `CREATE ROLE caddy LOGIN; GRANT USAGE, CREATE ON SCHEMA public TO caddy`)
	dsn := func(q url.Values) string {
		return (&url.URL{Scheme: "postgres", User: url.User("caddy"), Host: srv.Addr, Path: "/postgres", RawQuery: q.Encode()}).String()
	}
	full := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CA}, "sslcert": {certs.ClientCert}, "sslkey": {certs.ClientKey}}
	s, _ := provision(t, storeJSON(dsn(full), ""))
	everyOperation(t, s)
	if got := srv.Psql(t, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'caddy' AND s.ssl AND s.client_dn LIKE '%caddy%'`); got == "0" {
		t.Fatal("no TLS connection with the client certificate seen by the server")
	}

	refused := func(name string, q url.Values, want string) {
		t.Helper()
		s, _ := provision(t, storeJSON(dsn(q), uniqueTable(), "statement_timeout", `"3s"`))
		_, _, err := s.Claim(context.Background(), "k", "tok", time.Minute)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: claim = %v; want an error with %q", name, err, want)
		}
	}
	other := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.OtherCA}, "sslcert": {certs.ClientCert}, "sslkey": {certs.ClientKey}}
	refused("another CA", other, "certificate")
	noCert := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CA}}
	refused("no client certificate", noCert, "certificate")
	refused("no TLS", url.Values{"sslmode": {"disable"}}, "pg_hba.conf")
	_ = caddy.Duration(0)
}
