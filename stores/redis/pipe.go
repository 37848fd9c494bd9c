package redis

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"
)

// pipe sends the claims and commits of every request on one
// connection, pipelined: a command is written at once when the
// connection has no batch awaiting replies (so a lone request pays one
// round trip and no wait), and otherwise joins the next batch, written
// as soon as the replies of the one in flight are in. Under load a
// batch carries every command that arrived during one round trip: one
// write and one read for many requests, on both sides.
//
// There is no goroutine of its own: callers write the batches, and the
// replies are read by the callers in turn. The first caller with a
// command in flight reads the replies in order, handing each to its
// caller, until its own arrives; then it hands the reading to the caller
// of the next reply due. A request alone thus reads its own reply, as a
// plain client does, and no reply costs more than waking its caller.
//
// It serves a standalone server (the go-redis client's dialer applies
// TLS); a Cluster and Sentinel use go-redis, whose clients follow the
// topology.
type pipe struct {
	cs connSettings

	mu      sync.Mutex
	conn    *pipeConn     // nil when there is none
	dialing chan struct{} // closed when the dial under way ends
	dialErr error         // its failure, for the callers that waited for it
	closed  bool
}

var errPipeClosed = errors.New("redis store: client closed")

func newPipe(cs connSettings) *pipe { return &pipe{cs: cs} }

// pipeConn is one connection of the pipe.
type pipeConn struct {
	p  *pipe
	nc net.Conn
	br *bufio.Reader

	mu       sync.Mutex
	wbuf     []byte      // commands not yet written
	spare    []byte      // the other write buffer
	queue    []*pipeCall // every call not yet answered, in order
	head     int         // queue[head] is the next to be answered
	unsent   int         // calls at the end of queue that are in wbuf
	writing  bool        // a caller is writing
	awaiting int         // calls written and not yet answered
	reading  bool        // a caller is reading; always so while awaiting > 0
	broken   error
}

// pipeCall is one command: its reply, or the turn to read, handed to its
// caller.
type pipeCall struct {
	done chan struct{}
	read bool // woken to read the replies, its own not yet in
	val  string
	null bool
	err  error
}

var callPool = sync.Pool{New: func() any { return &pipeCall{done: make(chan struct{}, 1)} }}

// pipeCmd is a command of the pipe: `SET key <v1><v2><v3> PX ttl [NX]
// GET`, or, with script set, that command as it is (the claim script's
// EVALSHA, whose reply is a string).
type pipeCmd struct {
	key, v1, v2, v3 string
	ttl             time.Duration
	nx              bool
	script          []string
}

func (cmd *pipeCmd) append(b []byte) []byte {
	if cmd.script != nil {
		return appendCommand(b, cmd.script...)
	}
	return appendSet(b, cmd.key, cmd.v1, cmd.v2, cmd.v3, cmd.ttl, cmd.nx)
}

// set runs `SET key <v1><v2><v3> PX ttl [NX] GET` and returns the old
// value, or null. A command lost with its connection is sent
// once more on a new one (the store's SETs are safe to repeat: a claim
// finds its own lease, a commit its own record).
func (p *pipe) set(ctx context.Context, key, v1, v2, v3 string, ttl time.Duration, nx bool) (old string, null bool, err error) {
	return p.run(ctx, &pipeCmd{key: key, v1: v1, v2: v2, v3: v3, ttl: ttl, nx: nx})
}

// evalsha runs `EVALSHA sha 1 key args...` for a script whose reply is a
// string (the claim script: safe to repeat, see lua/claim.lua).
func (p *pipe) evalsha(ctx context.Context, sha, key string, args ...string) (string, error) {
	val, _, err := p.run(ctx, &pipeCmd{script: append([]string{"EVALSHA", sha, "1", key}, args...)})
	return val, err
}

func (p *pipe) run(ctx context.Context, cmd *pipeCmd) (old string, null bool, err error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return "", false, err
		}
		c, err := p.get(ctx)
		if err != nil {
			return "", false, err
		}
		call := callPool.Get().(*pipeCall)
		lead, ok := c.send(call, cmd)
		if !ok {
			callPool.Put(call)
			continue // the connection broke under us: get another
		}
		if !lead {
			<-call.done
			lead = call.read
		}
		if lead {
			c.readUntil(call)
		}
		old, null, err = call.val, call.null, call.err
		*call = pipeCall{done: call.done}
		callPool.Put(call)
		if err == nil || attempt > 0 || !retriable(err) {
			return old, null, err
		}
	}
}

// get returns the current connection, dialing one if there is none.
// Callers that come while a dial is under way share it (and its error).
func (p *pipe) get(ctx context.Context) (*pipeConn, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, errPipeClosed
		}
		if c := p.conn; c != nil {
			p.mu.Unlock()
			return c, nil
		}
		if ch := p.dialing; ch != nil {
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			p.mu.Lock()
			if p.conn == nil && p.dialErr != nil && p.dialing == nil {
				err := p.dialErr
				p.mu.Unlock()
				return nil, err
			}
			continue
		}
		ch := make(chan struct{})
		p.dialing = ch
		p.mu.Unlock()
		nc, br, _, err := p.cs.open(context.WithoutCancel(ctx), 2)
		p.mu.Lock()
		p.dialing = nil
		close(ch)
		if err != nil {
			p.dialErr = err
			p.mu.Unlock()
			return nil, err
		}
		p.dialErr = nil
		if p.closed {
			nc.Close()
			continue
		}
		p.conn = &pipeConn{p: p, nc: nc, br: br}
	}
}

// close closes the pipe and its connection; calls waiting for replies
// fail.
func (p *pipe) close() {
	p.mu.Lock()
	p.closed = true
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// send queues the command and writes it, with whatever else is queued,
// unless a batch is awaiting replies (then the caller that reads them
// writes it when they are in). It reports whether the caller is to read
// (no one is), and false if the connection is broken.
func (c *pipeConn) send(call *pipeCall, cmd *pipeCmd) (lead, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return false, false
	}
	c.wbuf = cmd.append(c.wbuf)
	c.queue = append(c.queue, call)
	c.unsent++
	if !c.reading {
		c.reading, lead = true, true
	}
	if !c.writing && c.awaiting == 0 {
		c.flushLocked()
	}
	return lead, true
}

// flushLocked writes the queued commands, with c.mu held on entry and on
// return (it is released during the write). Commands queued during the
// write wait for its replies, unless those are all in by the time the
// write returns.
func (c *pipeConn) flushLocked() {
	for c.unsent > 0 && c.broken == nil {
		b := c.wbuf
		c.wbuf, c.spare = c.spare[:0], nil
		c.awaiting += c.unsent
		c.unsent = 0
		c.writing = true
		c.mu.Unlock()
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.p.cs.writeTimeout))
		_, err := c.nc.Write(b)
		c.mu.Lock()
		c.writing = false
		if cap(b) <= 64<<10 {
			c.spare = b[:0]
		}
		if err != nil {
			c.nc.Close() // the reader fails every call
			return
		}
		if c.awaiting > 0 {
			return // the reader writes the rest when the replies are in
		}
	}
}

// readUntil reads replies in order, handing each to its caller, until
// mine's; then it hands the reading to the caller of the next reply due,
// if any. When the connection breaks it fails every call queued.
func (c *pipeConn) readUntil(mine *pipeCall) {
	for {
		if c.br.Buffered() == 0 {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.p.cs.readTimeout))
		}
		r, err := readReply(c.br, 0)
		if err == nil && r.kind == '>' {
			continue // a push (RESP3 only): not ours
		}
		c.mu.Lock()
		if err == nil && (c.head >= len(c.queue) || c.awaiting == 0) {
			err = errProtocol
		}
		if err != nil {
			c.mu.Unlock()
			c.fail(err, mine)
			return
		}
		call := c.queue[c.head]
		c.queue[c.head] = nil
		c.head++
		c.awaiting--
		if c.awaiting == 0 && !c.writing {
			c.flushLocked() // the commands that waited for this batch
		}
		var next *pipeCall
		if call == mine {
			if c.awaiting > 0 {
				next = c.queue[c.head]
				next.read = true
			} else {
				c.reading = false
			}
		}
		if c.head == len(c.queue) {
			c.queue, c.head = c.queue[:0], 0
		} else if c.head >= 1024 && c.head >= len(c.queue)/2 {
			// Under steady load the queue is never empty: drop the
			// answered front now and then, so it does not grow forever.
			n := copy(c.queue, c.queue[c.head:])
			clear(c.queue[n:])
			c.queue, c.head = c.queue[:n], 0
		}
		c.mu.Unlock()
		switch {
		case r.kind == '_':
			call.null = true
		case r.kind == '$' || r.kind == '+':
			call.val = r.str
		default:
			call.err = r.err()
			if call.err == nil {
				call.err = errProtocol
			} else if isRetiredMaster(call.err) {
				c.nc.Close() // e.g. an address that became a replica: dial again
			}
		}
		if call != mine {
			call.done <- struct{}{}
			continue
		}
		if next != nil {
			next.done <- struct{}{}
		}
		return
	}
}

// fail closes the connection and fails every call queued on it; mine is
// the reader's own, which it returns itself.
func (c *pipeConn) fail(err error, mine *pipeCall) {
	c.nc.Close()
	c.mu.Lock()
	c.broken = err
	calls := c.queue[c.head:]
	c.queue, c.wbuf = nil, nil
	c.reading = false
	c.mu.Unlock()
	c.p.mu.Lock()
	if c.p.conn == c {
		c.p.conn = nil
	}
	c.p.mu.Unlock()
	if errors.Is(err, net.ErrClosed) {
		err = errConnLost
	}
	for _, call := range calls {
		call.err = err
		if call != mine {
			call.done <- struct{}{}
		}
	}
}

var errConnLost = errors.New("redis store: connection to Redis lost")

// retriable reports whether a command that failed with err is sent once
// more on a new connection: not after an error reply (Redis answered) nor
// a timeout (the request has waited read_timeout already).
func retriable(err error) bool {
	var re replyError
	var ne net.Error
	return !errors.As(err, &re) && !(errors.As(err, &ne) && ne.Timeout())
}

// isRetiredMaster reports an error of a server that is no longer a
// master (demoted by an operator or a failover): READONLY, or MASTERDOWN.
func isRetiredMaster(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "READONLY") || strings.HasPrefix(s, "MASTERDOWN")
}
