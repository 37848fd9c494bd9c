package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sangho/caddy-sangho-dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

const secret = "whsec_postgres_server_test"

func freePort(t *testing.T) int { return netkit.FreePort(t) }

// load adapts a Caddyfile and runs it in this process (a reload if
// Caddy runs); Caddy stops when the test ends.
func load(t *testing.T, caddyfile string) {
	t.Helper()
	if err := handlertest.Load(t, caddyfile); err != nil {
		t.Fatalf("loading: %v", err)
	}
}

func config(adminPort, port int, backend, dsn, table, extra string) string {
	return handlertest.Site(adminPort, port, fmt.Sprintf(`	sangho_dedup {
		secret %s
		store postgres {
			dsn "%s"
			table %s
		}
		%s
	}
	reverse_proxy %s`, secret, dsn, table, extra, backend))
}

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

type answer struct {
	status int
	dedup  string
}

func send(t *testing.T, url, body string) answer {
	t.Helper()
	for attempt := 0; ; attempt++ {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var ev struct{ ID string }
		_ = json.Unmarshal([]byte(body), &ev)
		req.Header.Set("Sangho-Event-ID", ev.ID)
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret))
		resp, err := client.Do(req)
		if err != nil {
			if attempt < 20 { // a listener handed over during a reload
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return answer{resp.StatusCode, resp.Header.Get("Sangho-Dedup")}
	}
}

func admin(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// connPIDs are the server processes of the store's connections.
func connPIDs(t *testing.T, srv *pgtest.Server) string {
	return srv.Psql(t, `SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE application_name = 'caddy-sangho-dedup'`)
}

// A real Caddy with sangho_dedup on store postgres in front of a
// backend: a new event is processed once and its row reads like the
// guide's; a duplicate is answered by the handler; another body under
// the same ID is a payload mismatch (fingerprints); the admin API shows
// and forgets the event, and the next delivery is processed again; a
// reload keeps the pool (the same server connections serve on).
func TestServerPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	l := ledger.New(t)
	adminPort, port := freePort(t), freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/webhook", port)
	load(t, config(adminPort, port, l.Addr, srv.DSN, "processed_webhook_events", ""))

	body := `{"id":"evt_pg_1","type":"payment_intent.succeeded","data":{"amount":100}}`
	if a := send(t, url, body); a.status != 200 || a.dedup == "duplicate" {
		t.Fatalf("first delivery = %+v", a)
	}
	for range 3 {
		if a := send(t, url, body); a.status != 200 || a.dedup != "duplicate" {
			t.Fatalf("duplicate = %+v", a)
		}
	}
	if _, done := l.Counts("evt_pg_1"); done != 1 {
		t.Fatalf("processed %d times", done)
	}
	row := srv.Psql(t, `SELECT event_type, processed_at IS NOT NULL, length(fingerprint), lease_token IS NULL, expires_at > now() + interval '71 hours'
  FROM processed_webhook_events WHERE event_id = 'sangho_dedup:evt_pg_1'`)
	if row != "payment_intent.succeeded|t|17|t|t" { // "x" and 16 hex digits: the xxh64 fingerprint
		t.Fatalf("row = %q", row)
	}
	if a := send(t, url, `{"id":"evt_pg_1","type":"payment_intent.succeeded","data":{"amount":999}}`); a.status != 422 || a.dedup != "payload_mismatch" {
		t.Fatalf("another body under the same ID = %+v; want 422 payload_mismatch", a)
	}

	api := fmt.Sprintf("http://127.0.0.1:%d/sangho_dedup/sangho_dedup:/events/evt_pg_1", adminPort)
	code, got := admin(t, http.MethodGet, api)
	if code != 200 || got["state"] != "done" {
		t.Fatalf("admin get = %d %v", code, got)
	}
	if code, got := admin(t, http.MethodDelete, api); code != 200 {
		t.Fatalf("admin forget = %d %v", code, got)
	}
	if n := srv.Psql(t, `SELECT count(*) FROM processed_webhook_events`); n != "0" {
		t.Fatalf("%s rows after forget", n)
	}
	if a := send(t, url, body); a.status != 200 || a.dedup == "duplicate" {
		t.Fatalf("delivery after forget = %+v", a)
	}
	if _, done := l.Counts("evt_pg_1"); done != 2 {
		t.Fatalf("processed %d times after forget, want 2", done)
	}

	before := connPIDs(t, srv)
	if before == "" {
		t.Fatal("no connection of the store seen")
	}
	load(t, config(adminPort, port, l.Addr, srv.DSN, "processed_webhook_events", "retry_after 7s"))
	for i := range 5 {
		if a := send(t, url, fmt.Sprintf(`{"id":"evt_pg_after_%d","type":"x"}`, i)); a.status != 200 {
			t.Fatalf("after reload = %+v", a)
		}
	}
	after := connPIDs(t, srv)
	for _, pid := range strings.Split(before, ",") {
		if !strings.Contains(","+after+",", ","+pid+",") {
			t.Fatalf("connections before the reload %s, after %s: the pool was not kept", before, after)
		}
	}
	_ = context.Background()
}
