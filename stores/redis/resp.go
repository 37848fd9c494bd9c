package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The store's own Redis connections (the claim and commit pipe, and the
// tracking connection of the done-record cache) speak RESP directly:
// every command they send is known in advance, so they encode it into a
// reused buffer without boxing arguments, and read replies without
// go-redis's per-command objects. Everything else (scripts, checks,
// Cluster, WAIT) goes through go-redis.

// appendCommand appends a RESP array of bulk strings.
func appendCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = appendBulk(b, a)
	}
	return b
}

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

func appendBulkInt(b []byte, n int64) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], n, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, '\r', '\n')
	b = append(b, d...)
	return append(b, '\r', '\n')
}

// appendSet appends `SET key <v1><v2><v3> PX ms [NX] GET`.
func appendSet(b []byte, key, v1, v2, v3 string, ttl time.Duration, nx bool) []byte {
	if nx {
		b = append(b, "*7\r\n$3\r\nSET\r\n"...)
	} else {
		b = append(b, "*6\r\n$3\r\nSET\r\n"...)
	}
	b = appendBulk(b, key)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v1)+len(v2)+len(v3)), 10)
	b = append(b, '\r', '\n')
	b = append(b, v1...)
	b = append(b, v2...)
	b = append(b, v3...)
	b = append(b, "\r\n$2\r\nPX\r\n"...)
	b = appendBulkInt(b, max(ttl.Milliseconds(), 1))
	if nx {
		b = append(b, "$2\r\nNX\r\n"...)
	}
	return append(b, "$3\r\nGET\r\n"...)
}

// replyError is an error reply from Redis. It is a goredis.Error, so that
// the store tells it apart from a broken connection (isNoPerm).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ goredis.Error = replyError("")

// errProtocol is a reply the store cannot read: the connection is closed.
var errProtocol = errors.New("redis store: unexpected reply from Redis")

// reply is one RESP2/RESP3 value. Scalars carry str (bulk, simple and
// verbatim strings, errors, doubles, big numbers) or num (integers,
// booleans); aggregates (array, set, map, push, attribute) carry elems
// (a map's keys and values alternate).
type reply struct {
	kind  byte // the RESP type byte; '_' for null, whatever the protocol
	str   string
	num   int64
	elems []reply
}

func (r *reply) isNull() bool { return r.kind == '_' }

// err returns the error of an error reply, else nil.
func (r *reply) err() error {
	if r.kind == '-' || r.kind == '!' {
		return replyError(r.str)
	}
	return nil
}

// maxReplyElems bounds an aggregate reply: the store reads short replies
// only, and a corrupt length must not allocate gigabytes.
const maxReplyElems = 1 << 16

// maxReplyBulk bounds a bulk string: a done record or a lease is a few
// hundred bytes.
const maxReplyBulk = 64 << 20

// readReply reads one value. depth bounds nesting.
func readReply(br *bufio.Reader, depth int) (reply, error) {
	line, err := readLine(br)
	if err != nil {
		return reply{}, err
	}
	if len(line) == 0 {
		return reply{}, errProtocol
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+', '-', ',', '(':
		return reply{kind: kind, str: string(rest)}, nil
	case ':':
		n, err := parseInt(rest)
		return reply{kind: kind, num: n}, err
	case '#':
		if len(rest) != 1 || (rest[0] != 't' && rest[0] != 'f') {
			return reply{}, errProtocol
		}
		return reply{kind: kind, num: b2i(rest[0] == 't')}, nil
	case '_':
		return reply{kind: '_'}, nil
	case '$', '=', '!':
		n, err := parseInt(rest)
		if err != nil {
			return reply{}, err
		}
		if n < 0 {
			return reply{kind: '_'}, nil // RESP2 null bulk string
		}
		if n > maxReplyBulk {
			return reply{}, errProtocol
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(br, buf); err != nil {
			return reply{}, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return reply{}, errProtocol
		}
		s := string(buf[:n])
		if kind == '=' && len(s) >= 4 { // verbatim: "txt:..."
			s = s[4:]
		}
		if kind == '!' {
			kind = '-'
		}
		return reply{kind: kind, str: s}, nil
	case '*', '~', '>', '%', '|':
		n, err := parseInt(rest)
		if err != nil {
			return reply{}, err
		}
		if n < 0 {
			return reply{kind: '_'}, nil // RESP2 null array
		}
		if kind == '%' || kind == '|' {
			n *= 2
		}
		if n > maxReplyElems || depth > 8 {
			return reply{}, errProtocol
		}
		r := reply{kind: kind, elems: make([]reply, n)}
		for i := range r.elems {
			if r.elems[i], err = readReply(br, depth+1); err != nil {
				return reply{}, err
			}
		}
		if kind == '|' { // an attribute precedes the real reply: skip it
			return readReply(br, depth+1)
		}
		return r, nil
	}
	return reply{}, errProtocol
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// readLine returns a line without its CRLF, valid until the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errProtocol
	}
	return line[:len(line)-2], nil
}

func parseInt(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, errProtocol
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, errProtocol
	}
	return n, nil
}

func ioReadFull(br *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := br.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// connSettings are what the store's own connections need from the
// go-redis client: how to reach the (current master) server, TLS
// included, and how to log in.
type connSettings struct {
	dial         func(ctx context.Context, network, addr string) (net.Conn, error)
	network      string
	addr         string
	username     string
	password     string
	db           int
	clientName   string
	dialTimeout  time.Duration
	readTimeout  time.Duration
	writeTimeout time.Duration
}

// settingsOf takes the connection settings of a standalone client. Its
// Dialer applies TLS.
func settingsOf(o *goredis.Options) connSettings {
	cs := connSettings{
		dial: o.Dialer, network: o.Network, addr: o.Addr,
		username: o.Username, password: o.Password, db: o.DB, clientName: o.ClientName,
		dialTimeout: o.DialTimeout, readTimeout: o.ReadTimeout, writeTimeout: o.WriteTimeout,
	}
	if cs.network == "" {
		cs.network = "tcp"
	}
	if cs.dialTimeout <= 0 {
		cs.dialTimeout = 5 * time.Second
	}
	if cs.readTimeout <= 0 {
		cs.readTimeout = 3 * time.Second
	}
	if cs.writeTimeout <= 0 {
		cs.writeTimeout = cs.readTimeout
	}
	return cs
}

// open dials and logs in: HELLO <proto> [AUTH user pass] [SETNAME name],
// then SELECT db when db is not 0, then the extra commands (each
// expecting one reply). It returns the connection and its reader, and
// the replies of the extra commands.
func (cs connSettings) open(ctx context.Context, proto int, extra ...[]string) (net.Conn, *bufio.Reader, []reply, error) {
	dctx, cancel := context.WithTimeout(ctx, cs.dialTimeout)
	defer cancel()
	nc, err := cs.dial(dctx, cs.network, cs.addr)
	if err != nil {
		return nil, nil, nil, err
	}
	hello := []string{"HELLO", strconv.Itoa(proto)}
	if cs.password != "" {
		user := cs.username
		if user == "" {
			user = "default"
		}
		hello = append(hello, "AUTH", user, cs.password)
	}
	if cs.clientName != "" {
		hello = append(hello, "SETNAME", cs.clientName)
	}
	cmds := [][]string{hello}
	if cs.db != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(cs.db)})
	}
	cmds = append(cmds, extra...)
	var b []byte
	for _, c := range cmds {
		b = appendCommand(b, c...)
	}
	_ = nc.SetDeadline(time.Now().Add(cs.readTimeout))
	if _, err := nc.Write(b); err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	var replies []reply
	for i, c := range cmds {
		r, err := readReply(br, 0)
		for err == nil && r.kind == '>' { // a push before the replies
			r, err = readReply(br, 0)
		}
		if err == nil {
			err = r.err()
		}
		if err != nil {
			nc.Close()
			return nil, nil, nil, fmt.Errorf("redis store: %s: %w", strings.Join(c[:min(2, len(c))], " "), err)
		}
		if i >= len(cmds)-len(extra) {
			replies = append(replies, r)
		}
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, br, replies, nil
}
