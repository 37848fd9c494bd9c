package postgres

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// passwordHBA trusts the superuser and asks every other role for its
// password (SCRAM), so that the roles of the docs log in as documented.
var passwordHBA = []string{
	"host all postgres 127.0.0.1/32 trust",
	"host all all 127.0.0.1/32 scram-sha-256",
}

// docBlock returns the SQL block of docs/postgres.md after the marker
// <!-- test: name -->, as the reader sees it.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- test: " + regexp.QuoteMeta(name) + " -->\n```sql\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/postgres.md has no sql block marked %q", name)
	}
	return string(m[1])
}

// docDSN is the dsn of the caddyfile block of docs/postgres.md marked
// name.
func docDSN(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- test: " + regexp.QuoteMeta(name) + " -->\n```caddyfile\n.*?dsn \"([^\"]*)\".*?```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/postgres.md has no caddyfile block with a dsn marked %q", name)
	}
	return string(m[1])
}

// psqlFile runs sql as a reader of the docs would, psql -f with the
// text in a file (each statement on its own, as CREATE DATABASE needs),
// through dsn.
func psqlFile(t *testing.T, dsn, sql string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "block.sql")
	if err := os.WriteFile(f, []byte(sql), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(pgtest.Bin(t, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", f).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f of\n%s: %v\n%s", sql, err, out)
	}
}

// docSetup runs the docs' role and database blocks as the superuser,
// then the blocks named in the database they create (as its owner, the
// superuser), and returns the DSN of that database for the superuser
// and for the docs' role. It checks that the database is the one the
// docs' first DSN names.
func docSetup(t *testing.T, srv *pgtest.Server, blocks ...string) (owner, role string) {
	t.Helper()
	create := docBlock(t, "database")
	m := regexp.MustCompile(`CREATE DATABASE (\w+);`).FindStringSubmatch(create)
	if m == nil {
		t.Fatalf("the database block creates no database: %q", create)
	}
	db := m[1]
	b, err := os.ReadFile("../../docs/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`dsn "postgres://[^"/]*/` + db + `\?`).Match(b) {
		t.Fatalf("the first DSN of docs/postgres.md does not name the database %q its database block creates", db)
	}
	psqlFile(t, srv.DSN, docBlock(t, "role"))
	psqlFile(t, srv.DSN, create)
	owner = strings.Replace(srv.DSN, "/postgres?", "/"+db+"?", 1)
	for _, name := range blocks {
		psqlFile(t, owner, docBlock(t, name))
	}
	role = strings.Replace(srv.DSNAs("caddy_dedup", "change-me"), "/postgres?", "/"+db+"?", 1)
	return owner, role
}

// everyOperation runs every store operation once and fails the test on
// an error or a wrong answer.
func everyOperation(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	res, _, err := s.Claim(ctx, "k1", "tok", time.Minute)
	must("claim", err)
	if res != dedup.Claimed {
		t.Fatalf("claim = %v", res)
	}
	ok, err := s.Renew(ctx, "k1", "tok", time.Minute)
	must("renew", err)
	held, err2 := s.Commit(ctx, "k1", "tok", dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "x"}, time.Hour)
	must("commit", err2)
	if !ok || !held {
		t.Fatalf("renew %v, commit held %v", ok, held)
	}
	e, err := s.Get(ctx, "k1")
	must("get", err)
	if e.State() != "done" {
		t.Fatalf("get = %+v", e)
	}
	_, _, err = s.Claim(ctx, "k2", "tok", time.Minute)
	must("claim", err)
	ok, err = s.Release(ctx, "k2", "tok")
	must("release", err)
	_, deleted, err := s.Forget(ctx, "k1", false)
	must("forget", err)
	if !ok || !deleted {
		t.Fatalf("release %v, forget %v", ok, deleted)
	}
	_, _, err = s.Claim(ctx, "k3", "tok", time.Millisecond)
	must("claim", err)
	time.Sleep(5 * time.Millisecond)
	_, swept, err := s.db.sweep(ctx)
	must("sweep", err)
	if !swept {
		t.Fatal("no sweep")
	}
}

// The docs' role and database blocks, then the DDL and the GRANT lines
// for create_table off, run verbatim as a new user would, give a role
// that can run every store operation with create_table off; and the
// DDL is the one the store runs itself.
func TestDocsGrantLeastPrivilege(t *testing.T) {
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	owner, role := docSetup(t, srv, "ddl", "grant")
	s, logs := provision(t, storeJSON(role, "", "create_table", "false"))
	everyOperation(t, s)
	if n := logs.FilterMessage("postgres permission missing").Len(); n != 0 {
		t.Fatalf("%d permission errors logged", n)
	}
	// The store's own DDL makes the same table.
	s2, _ := provision(t, storeJSON(owner, "own_ddl"))
	if _, _, err := s2.Claim(context.Background(), "x", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	appDB := *srv
	appDB.DSN = owner
	shape := func(table string) string {
		return appDB.Psql(t, `SELECT string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, ''), ', ' ORDER BY ordinal_position)
  FROM information_schema.columns WHERE table_name = '`+table+`'`) + " / " +
			appDB.Psql(t, `SELECT string_agg(replace(indexdef, '`+table+`', 'T'), ', ' ORDER BY indexdef) FROM pg_indexes WHERE tablename = '`+table+`'`) + " / " +
			appDB.Psql(t, `SELECT string_agg(pg_get_constraintdef(oid), ', ' ORDER BY 1) FROM pg_constraint WHERE conrelid = '`+table+`'::regclass`) + " / " +
			appDB.Psql(t, `SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = '`+table+`'::regclass`)
	}
	if a, b := shape("processed_webhook_events"), shape("own_ddl"); a != b {
		t.Fatalf("the docs' DDL and the store's differ:\n docs:  %s\n store: %s", a, b)
	}
}

// The docs' role and database blocks, then the GRANT line for
// create_table on (the default), run verbatim as a new user would: the
// role creates the table on first use, then runs every operation.
func TestDocsGrantCreateTable(t *testing.T) {
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	owner, role := docSetup(t, srv, "grant-create")
	s, _ := provision(t, storeJSON(role, ""))
	everyOperation(t, s)
	appDB := *srv
	appDB.DSN = owner
	if owner := appDB.Psql(t, `SELECT tableowner FROM pg_tables WHERE tablename = 'processed_webhook_events'`); owner != "caddy_dedup" {
		t.Fatalf("table owner = %q", owner)
	}
}

// A missing privilege is a store error and an error log naming the
// privilege and the table; once granted, the store works without a
// restart. A privilege revoked while running is found the same way.
func TestPermissionMissingThenGranted(t *testing.T) {
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	srv.Psql(t, docBlock(t, "ddl"))
	srv.Psql(t, `CREATE ROLE caddy_dedup LOGIN PASSWORD 'change-me';
GRANT USAGE ON SCHEMA public TO caddy_dedup;
GRANT SELECT, UPDATE, DELETE ON processed_webhook_events TO caddy_dedup;`)
	s, logs := provision(t, storeJSON(srv.DSNAs("caddy_dedup", "change-me"), "", "create_table", "false"))
	ctx := context.Background()
	_, _, err := s.Claim(ctx, "k", "tok", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "INSERT") || !strings.Contains(err.Error(), "processed_webhook_events") {
		t.Fatalf("claim without INSERT = %v; want an error naming INSERT and the table", err)
	}
	l := logs.FilterMessage("postgres permission missing").All()
	if len(l) != 1 || l[0].ContextMap()["privilege"] != "INSERT" || !strings.Contains(l[0].ContextMap()["table"].(string), "processed_webhook_events") {
		t.Fatalf("logs = %+v; want one naming INSERT and the table", l)
	}
	// the refusal is remembered: no check per request
	if _, _, err := s.Claim(ctx, "k", "tok", time.Minute); err == nil {
		t.Fatal("claim succeeded without INSERT")
	}
	if n := logs.FilterMessage("postgres permission missing").Len(); n != 1 {
		t.Fatalf("%d log lines for one refusal within a second", n)
	}

	srv.Psql(t, `GRANT INSERT ON processed_webhook_events TO caddy_dedup`)
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, _, err := s.Claim(ctx, "k", "tok", time.Minute)
		if err == nil && res == dedup.Claimed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim after GRANT = %v, %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	srv.Psql(t, `REVOKE DELETE ON processed_webhook_events FROM caddy_dedup`)
	if _, err := s.Release(ctx, "k", "tok"); err == nil {
		t.Fatal("release without DELETE succeeded")
	}
	_, _, err = s.Claim(ctx, "k2", "tok", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "DELETE") {
		t.Fatalf("claim after DELETE was revoked = %v; want the check to name DELETE", err)
	}
	if l := logs.FilterMessage("postgres permission missing").FilterField(zapString("privilege", "DELETE")).Len(); l != 1 {
		t.Fatalf("%d log lines naming DELETE", l)
	}
}

// create_table off and no table: a store error and a log line saying so.
func TestTableMissing(t *testing.T) {
	srv := pgtest.Start(t)
	s, logs := provision(t, storeJSON(srv.DSN, "nowhere", "create_table", "false"))
	_, _, err := s.Claim(context.Background(), "k", "tok", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "nowhere") || !strings.Contains(err.Error(), "create_table is off") {
		t.Fatalf("claim = %v", err)
	}
	if logs.FilterMessage("postgres table missing").Len() != 1 {
		t.Fatalf("logs = %v", logs.All())
	}
}

// A privilege revoked while the store runs is named in the statement's
// error and in the log line, as at start: every "postgres permission
// missing" line names UPDATE, not "a privilege".
func TestPrivilegeRevokedWhileRunningIsNamed(t *testing.T) {
	srv := pgtest.StartWith(t, pgtest.Options{HBA: passwordHBA})
	srv.Psql(t, docBlock(t, "ddl"))
	srv.Psql(t, `CREATE ROLE caddy_dedup LOGIN PASSWORD 'change-me';
GRANT USAGE ON SCHEMA public TO caddy_dedup;
GRANT SELECT, INSERT, UPDATE, DELETE ON processed_webhook_events TO caddy_dedup;`)
	s, logs := provision(t, storeJSON(srv.DSNAs("caddy_dedup", "change-me"), "", "create_table", "false"))
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "k", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	srv.Psql(t, `REVOKE UPDATE ON processed_webhook_events FROM caddy_dedup`)
	_, err := s.Renew(ctx, "k", "tok", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "UPDATE") {
		t.Fatalf("renew after UPDATE was revoked = %v; want an error naming UPDATE", err)
	}
	l := logs.FilterMessage("postgres permission missing").All()
	if len(l) == 0 {
		t.Fatal("no log line for the revoked privilege")
	}
	for _, e := range l {
		if p := e.ContextMap()["privilege"]; p != "UPDATE" {
			t.Fatalf("logged privilege %q; want UPDATE (lines: %+v)", p, l)
		}
	}
	// every request meanwhile is refused with the name, and the check is
	// not rerun (nor logged) more than once a second
	for range 5 {
		if _, _, err := s.Claim(ctx, "k2", "tok", time.Minute); err == nil || !strings.Contains(err.Error(), "UPDATE") {
			t.Fatalf("claim without UPDATE = %v; want an error naming UPDATE", err)
		}
	}
	if n := logs.FilterMessage("postgres permission missing").Len(); n != 1 {
		t.Fatalf("%d log lines for one revocation within a second; want 1", n)
	}
}
