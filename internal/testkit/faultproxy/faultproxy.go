// Package faultproxy is a TCP proxy for tests that puts network faults
// between a Redis client and a Redis server on loopback: added latency
// and latency spikes, a bandwidth limit, a black hole (bytes accepted,
// never answered, connections left open, no RST, delivered when the hole
// heals as TCP's retransmissions would), connection resets, and a reset
// right after a chosen Redis command reached the server, before its
// reply reaches the client (the command landed, the client sees an
// error).
//
// Every fault applies at once to the open connections and to new ones,
// and can be changed at any time. Shopify's toxiproxy does most of this
// but not the command-aware reset: its faults ("toxics") are byte-stream
// filters on one direction at a time that know neither where a Redis
// command ends nor when its reply came back.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection accepted on Addr to the upstream
// address.
type Proxy struct {
	ln       net.Listener
	upstream string

	latency atomic.Int64 // added to every chunk, each direction, ns
	rate    atomic.Int64 // bytes per second per direction and connection, 0: unlimited
	trig    atomic.Pointer[trigger]
	resets  atomic.Int64 // command-triggered resets done

	mu    sync.Mutex
	hole  chan struct{} // closed when the black hole heals; nil: no hole
	links map[*link]struct{}
	wg    sync.WaitGroup
	shut  bool
}

// Start listens on a free port of 127.0.0.1 and forwards to upstream.
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.shut = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

// SetLatency delays every chunk of bytes, in each direction, by d: a
// request-reply round trip takes 2d longer. Order is kept.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SetBandwidth limits each direction of each connection to
// bytesPerSecond (0: no limit).
func (p *Proxy) SetBandwidth(bytesPerSecond int) { p.rate.Store(int64(bytesPerSecond)) }

// BlackHole starts (true) or heals (false) a black hole: new
// connections are accepted and bytes are read from both ends, but
// nothing is delivered and no connection is closed or reset. On heal,
// what was held is delivered in order, as TCP retransmits after a
// network outage, including the end of a connection its client closed
// meanwhile.
func (p *Proxy) BlackHole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hole == nil:
		p.hole = make(chan struct{})
	case !on && p.hole != nil:
		close(p.hole)
		p.hole = nil
	}
}

func (p *Proxy) holeCh() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}

// ResetAll resets (TCP RST) every open connection, on both sides, and
// reports how many there were.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
	return len(links)
}

// Command is one Redis command as the client sent it: its arguments,
// the name first.
type Command [][]byte

// ResetAfter arms n command-triggered resets: each time a client sends
// a chunk of bytes holding a command for which match is true, the
// chunk is delivered to the server, nothing more is delivered either
// way on that connection, and once the server has answered every
// command delivered so far (so the matching command was executed), both
// sides of the connection are reset without the client seeing those
// answers. With auto-pipelining, the other commands of the same chunk
// share that fate. A later call replaces the armed trigger; n <= 0
// disarms it.
func (p *Proxy) ResetAfter(n int, match func(Command) bool) {
	if n <= 0 || match == nil {
		p.trig.Store(nil)
		return
	}
	t := &trigger{match: match}
	t.left.Store(int64(n))
	p.trig.Store(t)
}

// Resets reports how many command-triggered resets were done.
func (p *Proxy) Resets() int { return int(p.resets.Load()) }

type trigger struct {
	match func(Command) bool
	left  atomic.Int64
}

func (t *trigger) take() bool {
	for {
		n := t.left.Load()
		if n <= 0 {
			return false
		}
		if t.left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			resetConn(c)
			continue
		}
		l := &link{p: p, client: c.(*net.TCPConn), server: up.(*net.TCPConn), dead: make(chan struct{})}
		p.mu.Lock()
		if p.shut {
			p.mu.Unlock()
			l.reset()
			return
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		l.start()
	}
}

// chunk is what one read returned, stamped with when it was read.
type chunk struct {
	data []byte
	at   time.Time
}

// link is one proxied connection.
type link struct {
	p              *Proxy
	client, server *net.TCPConn
	dead           chan struct{} // closed by reset
	once           sync.Once

	// Counted on the way: commands the client sent that were delivered
	// to the server, and replies the server sent.
	sent, replied atomic.Int64
	cutAt         atomic.Int64  // > 0: reset once replied reaches it
	cut           atomic.Bool   // a triggered reset is under way: deliver nothing
	req, rep      resp          // parsers of each direction
	cutDone       chan struct{} // closed by cutOnce
	cutter        sync.Once
}

func (l *link) start() {
	l.cutDone = make(chan struct{})
	up := make(chan chunk, 64)
	down := make(chan chunk, 64)
	var wg sync.WaitGroup
	wg.Add(4)
	l.p.wg.Add(1)
	go func() { defer wg.Done(); l.read(l.client, up, false) }()
	go func() { defer wg.Done(); l.read(l.server, down, true) }()
	go func() { defer wg.Done(); l.write(up, l.server, true) }()
	go func() { defer wg.Done(); l.write(down, l.client, false) }()
	go func() {
		defer l.p.wg.Done()
		wg.Wait()
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	}()
}

// read copies src into ch until EOF or an error. Replies (fromServer)
// are counted as they are read, so that a triggered reset knows when the
// server has answered.
func (l *link) read(src *net.TCPConn, ch chan<- chunk, fromServer bool) {
	defer close(ch)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			if fromServer {
				k, _ := l.rep.feed(data, false)
				if at := l.cutAt.Load(); l.replied.Add(int64(k)) >= at && at > 0 {
					l.cutOnce()
				}
			}
			select {
			case ch <- chunk{data: data, at: time.Now()}:
			case <-l.dead:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers the chunks of ch to dst, with the faults in force;
// toServer tells the direction. At the end of ch it closes dst (FIN).
func (l *link) write(ch <-chan chunk, dst *net.TCPConn, toServer bool) {
	for {
		var c chunk
		var ok bool
		select {
		case c, ok = <-ch:
		case <-l.dead:
			return
		}
		if !ok {
			_ = dst.Close()
			return
		}
		if !l.wait(c.at.Add(time.Duration(l.p.latency.Load()))) {
			return
		}
		if h := l.p.holeCh(); h != nil {
			select {
			case <-h:
			case <-l.dead:
				return
			}
		}
		if l.cut.Load() {
			continue // a triggered reset is under way: nothing more is delivered
		}
		if toServer {
			k, cmds := l.req.feed(c.data, l.p.trig.Load() != nil)
			if t := l.p.trig.Load(); t != nil && matches(cmds, t.match) && t.take() {
				l.cut.Store(true)
				l.cutAt.Store(l.sent.Add(int64(k)))
				if err := l.send(dst, c.data); err != nil {
					l.reset()
					return
				}
				if l.replied.Load() >= l.cutAt.Load() {
					l.cutOnce()
				}
				go l.cutLater()
				continue
			}
			l.sent.Add(int64(k))
		}
		if err := l.send(dst, c.data); err != nil {
			l.reset()
			return
		}
	}
}

func matches(cmds []Command, match func(Command) bool) bool {
	for _, c := range cmds {
		if match(c) {
			return true
		}
	}
	return false
}

// cutOnce resets the link once the server has answered what was
// delivered before a trigger.
func (l *link) cutOnce() {
	// Both directions may find the cut due at once (the reply counted
	// as the trigger's command is delivered): once, or a second close
	// panics.
	l.cutter.Do(func() {
		close(l.cutDone)
		l.p.resets.Add(1)
		l.reset()
	})
}

// cutLater resets the link anyway if the server has not answered
// within 5 s.
func (l *link) cutLater() {
	select {
	case <-l.cutDone:
	case <-l.dead:
	case <-time.After(5 * time.Second):
		l.reset()
	}
}

// send writes b to dst, at most at the bandwidth limit.
func (l *link) send(dst *net.TCPConn, b []byte) error {
	for len(b) > 0 {
		rate := l.p.rate.Load()
		n := len(b)
		if rate > 0 {
			n = min(n, max(1, int(rate/20))) // slices of 50 ms
		}
		if _, err := dst.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if rate > 0 && !l.wait(time.Now().Add(time.Duration(int64(n)*int64(time.Second)/rate))) {
			return errors.New("reset")
		}
	}
	return nil
}

// wait sleeps until t; false if the link was reset meanwhile.
func (l *link) wait(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-l.dead:
		return false
	}
}

// reset closes both sides with RST (SO_LINGER 0) and stops the link.
func (l *link) reset() {
	l.once.Do(func() {
		close(l.dead)
		resetConn(l.client)
		resetConn(l.server)
	})
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// resp counts complete RESP values in a byte stream fed in chunks, and
// decodes commands (arrays of bulk strings) when asked to.
type resp struct {
	pending []byte
	broken  bool
}

// feed appends b and returns how many complete top-level values it
// completed (out-of-band push messages not counted) and, if decode, the
// commands among them.
func (r *resp) feed(b []byte, decode bool) (int, []Command) {
	if r.broken {
		return 0, nil
	}
	r.pending = append(r.pending, b...)
	n := 0
	var cmds []Command
	pos := 0
	for pos < len(r.pending) {
		end, push, err := skip(r.pending, pos)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			r.broken = true // not RESP: stop counting
			return n, cmds
		}
		if !push {
			n++
			if decode {
				if c, ok := command(r.pending[pos:end]); ok {
					cmds = append(cmds, c)
				}
			}
		}
		pos = end
	}
	r.pending = append(r.pending[:0], r.pending[pos:]...)
	return n, cmds
}

var errSyntax = errors.New("not RESP")

// line returns the end of the line starting at pos (after its CRLF) and
// its content.
func line(b []byte, pos int) (int, []byte, error) {
	for i := pos; i+1 < len(b); i++ {
		if b[i] == '\r' && b[i+1] == '\n' {
			if i == pos {
				return 0, nil, errSyntax // every RESP line starts with its type
			}
			return i + 2, b[pos:i], nil
		}
	}
	return 0, nil, io.ErrUnexpectedEOF
}

func atoi(b []byte) (int, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 {
		return 0, errSyntax
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errSyntax
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// skip returns the end of the RESP2/RESP3 value starting at pos, and
// whether it is a push message.
func skip(b []byte, pos int) (end int, push bool, err error) {
	if pos >= len(b) {
		return 0, false, io.ErrUnexpectedEOF
	}
	next, ln, err := line(b, pos)
	if err != nil {
		return 0, false, err
	}
	typ, arg := ln[0], ln[1:]
	switch typ {
	case '+', '-', ':', '_', '#', ',', '(':
		return next, false, nil
	case '$', '!', '=':
		n, err := atoi(arg)
		if err != nil {
			return 0, false, err
		}
		if n < 0 {
			return next, false, nil
		}
		if next+n+2 > len(b) {
			return 0, false, io.ErrUnexpectedEOF
		}
		return next + n + 2, false, nil
	case '*', '~', '>', '%', '|':
		n, err := atoi(arg)
		if err != nil {
			return 0, false, err
		}
		if typ == '%' || typ == '|' {
			n *= 2
		}
		if typ == '|' {
			n++ // an attribute precedes the value it describes
		}
		for range max(n, 0) {
			if next, _, err = skip(b, next); err != nil {
				return 0, false, err
			}
		}
		return next, typ == '>', nil
	}
	return 0, false, errSyntax
}

// command decodes an array of bulk strings.
func command(b []byte) (Command, bool) {
	next, ln, err := line(b, 0)
	if err != nil || ln[0] != '*' {
		return nil, false
	}
	n, err := atoi(ln[1:])
	if err != nil || n < 0 {
		return nil, false
	}
	c := make(Command, 0, n)
	for range n {
		var hdr []byte
		var start int
		start, hdr, err = line(b, next)
		if err != nil || hdr[0] != '$' {
			return nil, false
		}
		size, err := atoi(hdr[1:])
		if err != nil || size < 0 || start+size+2 > len(b) {
			return nil, false
		}
		c = append(c, b[start:start+size])
		next = start + size + 2
	}
	return c, true
}
