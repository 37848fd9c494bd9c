package sanghodedup

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestAdminDoRetriesAGetDroppedUnanswered: on a config load Caddy
// replaces its admin server and shuts the old one down in the
// background; a connection that lands on the old one meanwhile is
// closed unanswered (Go's server drops a request it read while shutting
// down) or reset (queued on the listener it closes). Both were seen
// right after a reload under load (TestServerTwoSiteBlocksAreTwoEndpoints,
// "EOF" and "connection reset by peer"). The command sends a GET again;
// it does not send a forget (DELETE) again. The admin here is a loopback
// server that drops its first two connections those two ways.
func TestAdminDoRetriesAGetDroppedUnanswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				switch n {
				case 1: // closed unanswered
					return
				case 2: // reset
					_ = c.(*net.TCPConn).SetLinger(0)
					return
				}
				resp := http.Response{StatusCode: 200, ProtoMajor: 1, ProtoMinor: 1, Close: true,
					ContentLength: 2, Body: io.NopCloser(strings.NewReader("[]"))}
				_ = resp.Write(c)
			}()
		}
	}()
	client, base, origin, err := adminClient(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	status, body, err := adminDo(client, base, origin, http.MethodGet, "/sangho_dedup/")
	if err != nil || status != 200 || string(body) != "[]" {
		t.Errorf("GET dropped twice, then answered: %d %q %v, want 200 []", status, body, err)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("GET: %d connections, want 3", n)
	}

	conns.Store(0)
	if _, _, err := adminDo(client, base, origin, http.MethodDelete, "/sangho_dedup/alpha/events/evt_1"); err == nil {
		t.Error("a forget dropped unanswered: no error")
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("a forget dropped unanswered was sent %d times, want once", n)
	}
}
