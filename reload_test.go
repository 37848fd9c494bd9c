package sanghodedup

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/sangho"
)

// TestServerReloadDuringBodyReadKeepsStore: a delivery is reading its
// body when a reload gives the endpoint a store of other settings (a
// new Redis client, file, PostgreSQL pool), so the old config's is
// given up. On a reload Caddy cleans the old config up without waiting
// for its requests: the delivery, served by the old config, must keep
// the old store until it is settled. It was counted only after its body
// was read and verified, so the store was closed under it: its claim
// failed (503), or, closed between claim and commit, its commit, and
// the event was processed again after lock_ttl.
func TestServerReloadDuringBodyReadKeepsStore(t *testing.T) {
	for name, stores := range map[string]func(t *testing.T) (before, after string){
		"file": func(t *testing.T) (string, string) {
			dir := t.TempDir()
			line := func(f string) string {
				return "store file {\n\t\t\tpath " + filepath.Join(dir, f) + "\n\t\t}"
			}
			return line("a.db"), line("b.db")
		},
		"redis": func(t *testing.T) (string, string) {
			line := redisStoreLine(startRedis(t).Addr)
			return line, strings.Replace(line, "\n\t\t}", "\n\t\t\tpool_size 7\n\t\t}", 1)
		},
		"postgres": func(t *testing.T) (string, string) {
			pg := pgtest.Start(t)
			line := func(conns int) string {
				return fmt.Sprintf("store postgres {\n\t\t\tdsn \"postgres://postgres@%s/postgres?sslmode=disable\"\n\t\t\tmax_conns %d\n\t\t}", pg.Addr, conns)
			}
			return line(4), line(5)
		},
	} {
		t.Run(name, func(t *testing.T) {
			before, after := stores(t)
			l := ledger.New(t)
			site := func(store string) string {
				return "\troute {\n\t\ttest_body_probe\n" + dedupSite(l.Addr, store) + "\n\t}"
			}
			s := startCaddy(t, site(before))
			bodyReadsStarted.Store(0)

			// A delivery whose body comes in two halves, the reload between.
			pr, pw := io.Pipe()
			req, _ := http.NewRequest(http.MethodPost, s.url, pr)
			req.ContentLength = int64(len(bodyA))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(bodyA), secret1))
			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := client.Do(req)
				done <- result{resp, err}
			}()
			half := len(bodyA) / 2
			if _, err := io.WriteString(pw, bodyA[:half]); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the delivery to reach the body read", func() bool { return bodyReadsStarted.Load() == 1 })

			s.load(t, site(after)) // the reload: the old config is cleaned up

			if _, err := io.WriteString(pw, bodyA[half:]); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			var res result
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("no answer within 30 s")
			}
			if res.err != nil {
				t.Fatalf("the delivery in flight across the reload: %v", res.err)
			}
			res.resp.Body.Close()
			if res.resp.StatusCode != 200 {
				t.Fatalf("the delivery in flight across the reload: %d, want 200 (its store was closed under it)", res.resp.StatusCode)
			}
			// Its record landed: back on the first store (the file store's
			// other settings are another file), the event is a duplicate.
			s.load(t, site(before))
			if a := send(t, s.url, bodyA, ""); a.status != 200 || a.dedup != "duplicate" {
				t.Errorf("the event again after the reload: %d %q, want 200 duplicate", a.status, a.dedup)
			}
			if rec, _ := l.Counts(""); rec != 1 {
				t.Errorf("backend received the event %d times, want 1", rec)
			}
		})
	}
}
