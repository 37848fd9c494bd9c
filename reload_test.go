package sanghodedup

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// TestServerReloadDuringBodyReadKeepsStore: deliveries are reading their
// bodies when a reload gives the endpoint a store of other settings (a
// new Redis client, file, PostgreSQL pool), so the old config's is
// given up; three reloads, back and forth, with 10 deliveries in flight
// at each. On a reload Caddy cleans the old config up without waiting
// for its requests: the deliveries, served by the old config, must keep
// the old store until they are settled. They were counted only after
// their body was read and verified, so the store was closed under them:
// their claim failed (503), or, closed between claim and commit, their
// commit, and the event was processed again after lock_ttl.
func TestServerReloadDuringBodyReadKeepsStore(t *testing.T) {
	const rounds, inFlight = 3, 10
	for name, stores := range reloadStores {
		t.Run(name, func(t *testing.T) {
			before, after := stores(t)
			configs := [2]string{before, after}
			l := ledger.New(t)
			site := func(store string) string {
				return "\troute {\n\t\ttest_body_probe\n" + dedupSite(l.Addr, store) + "\n\t}"
			}
			s := startCaddy(t, site(before))
			// Caddy's log from the first reload on, the plugin's warnings and
			// every error shown if the test fails (a 503 says only that the
			// store failed).
			s.logFile = filepath.Join(t.TempDir(), "caddy.log")
			defer func() {
				if t.Failed() {
					entries, _ := logEntries(t, s.logFile)
					for _, e := range entries {
						logger, _ := e["logger"].(string)
						if e["level"] == "error" || e["level"] == "warn" && strings.Contains(logger, "sangho") {
							t.Logf("caddy's log: %v", e)
						}
					}
				}
			}()
			// Without the linger of a reload (which would keep the old
			// store open by itself): the uses counted must keep it.
			restore := storepool.SetReloadLinger(0)
			defer restore()
			id := func(round, i int) string { return fmt.Sprintf("evt_reload_%d_%02d", round, i) }
			post := func(id string, body io.Reader) *http.Request {
				req, _ := http.NewRequest(http.MethodPost, s.url, body)
				req.ContentLength = int64(len(eventBody(id)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Sangho-Event-ID", id)
				req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(eventBody(id)), secret1))
				return req
			}

			for round := range rounds {
				// Deliveries whose bodies come in two halves, the reload between.
				bodyReadsStarted.Store(0)
				var wg sync.WaitGroup
				pipes := make([]*io.PipeWriter, inFlight)
				answers := make([]string, inFlight)
				for i := range inFlight {
					pr, pw := io.Pipe()
					pipes[i] = pw
					req := post(id(round, i), pr)
					wg.Go(func() {
						resp, err := client.Do(req)
						if err != nil {
							answers[i] = err.Error()
							return
						}
						resp.Body.Close()
						answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Sangho-Dedup"))
					})
					b := eventBody(id(round, i))
					if _, err := io.WriteString(pw, b[:len(b)/2]); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, "the deliveries to reach the body read", func() bool { return bodyReadsStarted.Load() == inFlight })

				s.load(t, site(configs[(round+1)%2])) // the old config is cleaned up

				for i, pw := range pipes {
					b := eventBody(id(round, i))
					if _, err := io.WriteString(pw, b[len(b)/2:]); err != nil {
						t.Fatal(err)
					}
					pw.Close()
				}
				wg.Wait()
				for i, a := range answers {
					if a != "200 " {
						t.Errorf("round %d: delivery %d in flight across the reload: %s, want 200 (its store was closed under it)", round, i, a)
					}
				}
			}

			// Their records landed: on the store that served them (the file
			// store's other settings are another file), each is a duplicate.
			// (With the linger back: a delivery the old server read just
			// before a reload must not be refused either.)
			restore()
			for _, cfg := range []int{rounds % 2, (rounds + 1) % 2} {
				s.load(t, site(configs[cfg]))
				for round := cfg; round < rounds; round += 2 {
					for i := range inFlight {
						if a := do(t, post(id(round, i), strings.NewReader(eventBody(id(round, i))))); a.status != 200 || a.dedup != "duplicate" {
							t.Errorf("round %d: event %d again: %d %q, want 200 duplicate", round, i, a.status, a.dedup)
						}
					}
				}
			}
			for round := range rounds {
				for i := range inFlight {
					if rec, _ := l.Counts(id(round, i)); rec != 1 {
						t.Errorf("round %d: the backend received event %d %d times, want 1", round, i, rec)
					}
				}
			}
		})
	}
}

// TestServerReloadKeepsStoreForRequestsStillOnTheWay: a request the old
// config's server read before a reload, still in a handler before
// sangho_dedup (a slow forward_auth, a rate limiter) when Caddy cleaned
// the old config up, reaches the old config's sangho_dedup afterwards.
// Its store, given up by the reload (the new config has other
// settings), must still be open to serve it: it was closed at once, and
// such a request was answered 503 (the flake of the reload test above,
// when Caddy's old server read a request just before its shutdown).
func TestServerReloadKeepsStoreForRequestsStillOnTheWay(t *testing.T) {
	for name, stores := range reloadStores {
		t.Run(name, func(t *testing.T) {
			before, after := stores(t)
			l := ledger.New(t)
			site := func(store string) string {
				return "\troute {\n\t\ttest_gate\n" + dedupSite(l.Addr, store) + "\n\t}"
			}
			s := startCaddy(t, site(before))
			id := "evt_on_the_way_" + name
			post := func() *http.Request {
				req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(eventBody(id)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Sangho-Event-ID", id)
				req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(eventBody(id)), secret1))
				return req
			}

			closeGate()
			defer openGate()
			got := make(chan string, 1)
			go func() {
				resp, err := client.Do(post())
				if err != nil {
					got <- err.Error()
					return
				}
				resp.Body.Close()
				got <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Sangho-Dedup"))
			}()
			waitFor(t, "the delivery to reach the handler before sangho_dedup", func() bool { return gate.arrived.Load() == 1 })
			s.load(t, site(after)) // the old config is cleaned up
			openGate()
			if a := <-got; a != "200 " {
				t.Fatalf("a delivery that reached sangho_dedup after the reload: %s, want 200 (processed on the old config's store)", a)
			}
			// Its record landed on the old config's store (for the file
			// store, the other file): back to it, the event is a duplicate.
			s.load(t, site(before))
			if a := do(t, post()); a.status != 200 || a.dedup != "duplicate" {
				t.Errorf("the event again on the old config's store: %d %q, want 200 duplicate", a.status, a.dedup)
			}
			if rec, _ := l.Counts(id); rec != 1 {
				t.Errorf("the backend received the event %d times, want 1", rec)
			}
		})
	}
}

// reloadStores gives, for each store with a shared resource, two store
// lines of different settings: a reload from one to the other gives up
// the old config's resource (a Redis client, an open file, a PostgreSQL
// pool) and takes another.
var reloadStores = map[string]func(t *testing.T) (before, after string){
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
}
