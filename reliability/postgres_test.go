package reliability

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/faultproxy"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// pgStore is the store block of an instance on PostgreSQL at addr.
func pgStore(addr, extra string) string {
	return fmt.Sprintf("store postgres {\n\t\t\tdsn \"postgres://postgres@%s/postgres?sslmode=disable\"\n\t\t\tstatement_timeout 500ms\n\t\t\t%s\n\t\t}", addr, extra)
}

// TestPostgresStormAcrossThreeInstances: three Caddy instances share one
// PostgreSQL table; every event is delivered four times at once, to
// random instances.
func TestPostgresStormAcrossThreeInstances(t *testing.T) {
	pg := pgtest.Start(t)
	l := ledger.New(t)
	l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 20 * time.Millisecond} })
	s := newSender(instances(t, 3, siteConfig(pgStore(pg.Addr, ""), l.Addr, "")), 4)
	ids, acked := s.run("pg_storm", 150*scale, nil)
	f := check(t, "duplicate storm, 3 instances, one PostgreSQL", s, l, ids, acked, false)
	if f.duplicates.Load()+f.conflicts.Load() == 0 {
		t.Error("no duplicate was absorbed: the storm did not storm")
	}
}

// TestPostgresRestartedImmediate: pg_ctl restart -m immediate (a crash:
// no shutdown checkpoint) mid-stream. Committed rows survive (WAL,
// synchronous_commit on); the 503s are retried and processed once.
func TestPostgresRestartedImmediate(t *testing.T) {
	pg := pgtest.Start(t)
	l := ledger.New(t)
	l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 10 * time.Millisecond} })
	// lock_ttl 10s: the commits held up by the restart are retried until
	// it is over; on a loaded machine PostgreSQL's crash recovery and the
	// pool's reconnection took more than 5 s, and a retry past the lease
	// is processed again, marked, by nature ("A PostgreSQL outage longer
	// than lock_ttl"), not what this test is about.
	s := newSender(instances(t, 3, siteConfig(pgStore(pg.Addr, ""), l.Addr, "lock_ttl 10s")), 3)
	n := 150 * scale
	ids, acked := s.run("pg_restart", n, func(p *atomic.Int64) {
		at(p, int64(n), func() {
			s.fig.faults.Add(1)
			pg.Ctl(t, "restart", "-m", "immediate")
		})
	})
	f := check(t, "PostgreSQL restarted -m immediate", s, l, ids, acked, false)
	if f.unavailable.Load() == 0 {
		t.Log("no 503 during the restart (it was quicker than any statement)")
	}
}

// TestPostgresStopped: PostgreSQL is stopped for 1.5 s. With
// on_store_error reject every delivery meanwhile is a 503, retried and
// processed once; with pass, deliveries go to the backend unprotected,
// so doubles are possible by design and counted, not asserted.
func TestPostgresStopped(t *testing.T) {
	for _, mode := range []string{"reject", "pass"} {
		t.Run(mode, func(t *testing.T) {
			pg := pgtest.Start(t)
			l := ledger.New(t)
			l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 10 * time.Millisecond} })
			s := newSender(instances(t, 2, siteConfig(pgStore(pg.Addr, ""), l.Addr, "lock_ttl 10s\n\t\ton_store_error "+mode)), 3)
			n := 150 * scale
			var outage time.Duration
			ids, acked := s.run("pg_stop_"+mode, n, func(p *atomic.Int64) {
				at(p, int64(n), func() {
					s.fig.faults.Add(1)
					began := time.Now()
					pg.Stop(t)
					time.Sleep(1500 * time.Millisecond)
					pg.Ctl(t, "start") // waits until the server accepts connections
					outage = time.Since(began)
				})
			})
			// The promise holds while the store is back before the
			// leases of the events it could not commit expire (lock_ttl
			// 10s): their commits are retried and land. Stopping and
			// starting PostgreSQL takes about 4.7 s here (the 1.5 s
			// pause, a fast shutdown, a start), more on a loaded
			// machine; past the lease, a retry may be processed again by
			// nature (logged "commit retried after lease expired"), and
			// is counted, not asserted.
			byNature := outage > 8*time.Second
			if byNature {
				t.Logf("PostgreSQL was unavailable for %v, close to lock_ttl: doubles are counted, not asserted", outage.Round(time.Millisecond))
			}
			f := check(t, "PostgreSQL stopped 1.5 s, on_store_error "+mode, s, l, ids, acked, mode == "pass" || byNature)
			if mode == "reject" && f.unavailable.Load() == 0 {
				t.Error("no 503 while PostgreSQL was stopped: the fault did not hit")
			}
		})
	}
}

// TestPostgresNetworkFaults: the same three instances reach PostgreSQL
// through a fault proxy each: 50 ms added each way; every connection
// reset (mid-statement under load) five times in a row; a black hole of
// 3 s, six times the statement timeout (500 ms), so a stalled network
// answers 503 instead of holding deliveries.
func TestPostgresNetworkFaults(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(pxs []*faultproxy.Proxy) (heal func())
	}{
		{"latency 50ms each way", func(pxs []*faultproxy.Proxy) func() {
			for _, px := range pxs {
				px.SetLatency(50 * time.Millisecond)
			}
			time.Sleep(2 * time.Second)
			return func() {
				for _, px := range pxs {
					px.SetLatency(0)
				}
			}
		}},
		{"connections reset mid-statement", func(pxs []*faultproxy.Proxy) func() {
			for range 5 {
				for _, px := range pxs {
					px.ResetAll()
				}
				time.Sleep(150 * time.Millisecond)
			}
			return func() {}
		}},
		{"black hole 3s", func(pxs []*faultproxy.Proxy) func() {
			for _, px := range pxs {
				px.BlackHole(true)
			}
			time.Sleep(3 * time.Second)
			return func() {
				for _, px := range pxs {
					px.BlackHole(false)
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pg := pgtest.Start(t)
			l := ledger.New(t)
			l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 10 * time.Millisecond} })
			var pxs []*faultproxy.Proxy
			var urls []string
			for range 3 {
				px := startProxy(t, pg.Addr)
				pxs = append(pxs, px)
				// lock_ttl 10s, as for the restart: on a loaded machine
				// the statements timed out for more than 5 s after the
				// resets, and a commit retried past its lease is
				// processed again, marked, by nature.
				urls = append(urls, startCaddy(t, siteConfig(pgStore(px.Addr(), ""), l.Addr, "lock_ttl 10s")).url)
			}
			s := newSender(urls, 3)
			n := 150 * scale
			ids, acked := s.run("pg_net", n, func(p *atomic.Int64) {
				at(p, int64(n)/2, func() {
					s.fig.faults.Add(1)
					c.fault(pxs)()
				})
			})
			f := check(t, "PostgreSQL network: "+c.name, s, l, ids, acked, false)
			if c.name == "black hole 3s" {
				if f.unavailable.Load() == 0 {
					t.Error("no 503 during the black hole")
				}
				if w := time.Duration(f.slowest.Load()); w > 4*time.Second {
					t.Errorf("the slowest answer took %v: the statement timeout did not bound it", w)
				}
			}
		})
	}
}
