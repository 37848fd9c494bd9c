package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

func start(t *testing.T) (*redistest.Server, *Proxy) {
	t.Helper()
	r := redistest.Start(t)
	p, err := Start(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return r, p
}

func client(t *testing.T, addr string, readTimeout time.Duration) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: readTimeout, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPassThrough(t *testing.T) {
	_, p := start(t)
	c := client(t, p.Addr(), time.Second)
	ctx := context.Background()
	for i := range 100 {
		if err := c.Set(ctx, "k", i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := c.Get(ctx, "k").Int(); err != nil || v != 99 {
		t.Fatalf("got %d, %v", v, err)
	}
}

// The matching command is executed by Redis, yet the client sees an
// error, not the reply.
func TestResetAfterCommand(t *testing.T) {
	r, p := start(t)
	c := client(t, p.Addr(), 2*time.Second)
	ctx := context.Background()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.ResetAfter(1, func(c Command) bool {
		return len(c) >= 3 && bytes.EqualFold(c[0], []byte("set")) && bytes.HasPrefix(c[2], []byte("done:"))
	})
	if err := c.Set(ctx, "other", "x", 0).Err(); err != nil {
		t.Fatalf("a command that does not match was hit: %v", err)
	}
	err := c.Set(ctx, "key", "done:1", 0).Err()
	if err == nil {
		t.Fatal("the client saw the reply of the command after which the connection was to be reset")
	}
	direct := r.Client(t)
	if v, err := direct.Get(ctx, "key").Result(); err != nil || v != "done:1" {
		t.Fatalf("the command did not land: %q, %v", v, err)
	}
	if p.Resets() != 1 {
		t.Fatalf("Resets() = %d", p.Resets())
	}
	// Armed once: the next one goes through, on a new connection.
	if err := c.Set(ctx, "key2", "done:2", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// Nothing is answered during the black hole; what was sent is delivered
// when it heals, and the proxy works again.
func TestBlackHole(t *testing.T) {
	r, p := start(t)
	c := client(t, p.Addr(), 200*time.Millisecond)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.BlackHole(true)
	err := c.Set(ctx, "late", "1", 0).Err()
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want a timeout in the black hole, got %v", err)
	}
	direct := r.Client(t)
	if n, _ := direct.Exists(ctx, "late").Result(); n != 0 {
		t.Fatal("a command went through the black hole")
	}
	p.BlackHole(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := direct.Exists(ctx, "late").Result(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held command was not delivered after the heal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

func TestLatencyAndBandwidth(t *testing.T) {
	_, p := start(t)
	ctx := context.Background()
	p.SetLatency(500 * time.Millisecond)
	if err := client(t, p.Addr(), 100*time.Millisecond).Ping(ctx).Err(); err == nil {
		t.Fatal("a 100 ms read timeout did not expire with 500 ms latency each way")
	}
	p.SetLatency(0)
	p.SetBandwidth(1000)
	c := client(t, p.Addr(), 200*time.Millisecond)
	if err := c.Set(ctx, "big", bytes.Repeat([]byte("x"), 2000), 0).Err(); err == nil {
		t.Fatal("2000 bytes passed 1000 B/s within 200 ms")
	}
	p.SetBandwidth(0)
	if err := client(t, p.Addr(), time.Second).Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestResetAll(t *testing.T) {
	_, p := start(t)
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := raw.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := p.ResetAll(); n != 1 {
		t.Fatalf("ResetAll reset %d connections, want 1", n)
	}
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("want connection reset by peer, got %v", err)
	}
	c := client(t, p.Addr(), time.Second)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("a new connection after the reset: %v", err)
	}
}

func TestRESP(t *testing.T) {
	var r resp
	in := "*3\r\n$3\r\nset\r\n$1\r\nk\r\n$6\r\ndone:1\r\n*1\r\n$4\r\nping\r\n"
	n, _ := r.feed([]byte(in[:10]), true)
	if n != 0 {
		t.Fatalf("counted %d in a partial command", n)
	}
	n, cmds := r.feed([]byte(in[10:]), true)
	if n != 2 || len(cmds) != 2 || string(cmds[0][2]) != "done:1" || string(cmds[1][0]) != "ping" {
		t.Fatalf("n=%d cmds=%q", n, cmds)
	}
	var rep resp
	replies := "+OK\r\n$-1\r\n%1\r\n+a\r\n:1\r\n>2\r\n+x\r\n+y\r\n|1\r\n+k\r\n+v\r\n*2\r\n_\r\n,1.5\r\n"
	if n, _ := rep.feed([]byte(replies), false); n != 4 {
		t.Fatalf("counted %d replies, want 4 (push not counted, attribute with its value)", n)
	}
}

// TestCutOnceResetsOnce: the read side (the server answered) and the
// write side (the trigger's command delivered) may both see that a cut
// is due at the same moment; the link is reset once, and neither
// panics on a second close (a reliability run once died of it).
func TestCutOnceResetsOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for i := range 2000 {
		c1, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		l := &link{p: &Proxy{}, client: c1.(*net.TCPConn), server: c2.(*net.TCPConn), dead: make(chan struct{}), cutDone: make(chan struct{})}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l.cutOnce()
			}()
		}
		close(start)
		wg.Wait()
		if n := l.p.resets.Load(); n != 1 {
			t.Fatalf("round %d: %d resets counted, want 1", i, n)
		}
	}
}
