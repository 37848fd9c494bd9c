package postgres

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// The password of the DSN never appears in an error or a log line: not
// on a wrong password, not with the server down, not when the DSN does
// not parse, and a placeholder resolves it from the environment.
func TestPasswordNeverInErrors(t *testing.T) {
	const pw = "Hunter2-s3cret-pw"
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	srv.Psql(t, `CREATE ROLE caddy LOGIN PASSWORD '`+pw+`'; GRANT USAGE, CREATE ON SCHEMA public TO caddy`)
	ctx := context.Background()
	check := func(name string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", name)
			return
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), url.QueryEscape(pw)) {
			t.Errorf("%s: the password is in the error: %v", name, err)
		}
	}

	t.Setenv("SANGHO_TEST_PGPASSWORD", pw)
	good, logs := provision(t, storeJSON("postgres://caddy:{env.SANGHO_TEST_PGPASSWORD}@"+srv.Addr+"/postgres?sslmode=disable", ""))
	everyOperation(t, good)

	wrongPW := pw + "-wrong"
	wrong, wlogs := provision(t, storeJSON("postgres://caddy:"+wrongPW+"@"+srv.Addr+"/postgres?sslmode=disable", uniqueTable()))
	_, _, err := wrong.Claim(ctx, "k", "tok", time.Minute)
	check("wrong password", err)
	if err != nil && strings.Contains(err.Error(), wrongPW) {
		t.Errorf("the wrong password is in the error: %v", err)
	}
	kv, _ := provision(t, storeJSON("host=127.0.0.1 port="+srv.Addr[strings.LastIndex(srv.Addr, ":")+1:]+" user=caddy password='"+wrongPW+"' dbname=postgres sslmode=disable", uniqueTable()))
	_, _, err = kv.Claim(ctx, "k", "tok", time.Minute)
	check("wrong password, key=value dsn", err)

	for name, dsn := range map[string]string{
		"bad port":        "postgres://caddy:" + pw + "@127.0.0.1:notaport/postgres",
		"bad escape":      "postgres://caddy:" + pw + "%zz@127.0.0.1/postgres",
		"bad sslmode":     "postgres://caddy:" + pw + "@127.0.0.1/postgres?sslmode=bogus",
		"bad key=value":   "host=127.0.0.1 password=" + pw + " port=abc",
		"quoted kv":       "host=127.0.0.1 password='" + pw + "' sslmode=nonsense",
		"broken url":      "postgres://caddy:" + pw + "@[::1/postgres",
		"unknown setting": "postgres://caddy:" + pw + "@127.0.0.1/postgres?sslmode=verify-full&sslrootcert=/nonexistent/" + pw,
	} {
		s := new(Store)
		if err := json.Unmarshal([]byte(storeJSON(dsn, "")), s); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := caddy.NewContext(caddy.Context{Context: ctx})
		err := s.Provision(cctx)
		if err == nil {
			_, _, err = s.Claim(ctx, "k", "tok", time.Minute)
			s.Cleanup()
		}
		cancel()
		if name == "unknown setting" && err != nil && strings.Contains(err.Error(), "/nonexistent/") {
			// a path is not a password, but this one holds it on purpose
			check(name, err)
			continue
		}
		check(name, err)
	}

	srv.Stop(t)
	_, _, err = good.Claim(ctx, "k9", "tok", time.Minute)
	check("server down", err)
	for _, l := range append(logs.All(), wlogs.All()...) {
		b, _ := json.Marshal(l.ContextMap())
		if strings.Contains(l.Message+string(b), pw) {
			t.Errorf("the password is in a log line: %s %s", l.Message, b)
		}
	}
}

// An unknown placeholder in the dsn is an error naming the option.
func TestDSNPlaceholderUnknown(t *testing.T) {
	s := &Store{DSN: "postgres://u:{env.SANGHO_TEST_UNSET_VAR}@h/db"}
	_, err := s.resolve()
	if err == nil || !strings.Contains(err.Error(), "dsn") {
		t.Fatalf("resolve = %v", err)
	}
}

// A DSN that does not resolve or parse is an error that holds no part of
// its password, whatever the password holds: a brace (Caddy's
// replacer named it as an unknown placeholder), a space unquoted in the
// key=value form (pgx quoted what followed it). (Found by review.)
func TestDSNErrorsHoldNoPartOfThePassword(t *testing.T) {
	const pw = "Hunter2-s3cret-pw"
	for name, dsn := range map[string]string{
		"a brace in a URL's password":          "postgres://caddy:{" + pw + "}@127.0.0.1/postgres",
		"a brace in a key=value password":      "host=127.0.0.1 user=caddy password={" + pw + "} dbname=postgres",
		"an unquoted space in a password":      "host=127.0.0.1 user=caddy password=Sec " + pw + " dbname=postgres",
		"an unquoted space, the password last": "host=127.0.0.1 user=caddy dbname=postgres password=Sec " + pw,
	} {
		_, err := (&Store{DSN: dsn}).resolve()
		if err == nil {
			t.Errorf("%s: resolved", name)
			continue
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "Secr") {
			t.Errorf("%s: the error holds the password: %v", name, err)
		}
		if !strings.Contains(err.Error(), "dsn") {
			t.Errorf("%s: the error does not name dsn: %v", name, err)
		}
	}
}
