package redis

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
)

// waitFor waits for cond, at most 10 s (poll.Until).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// TestRedisPipeConcurrentClaims: many requests at once through the pipe
// (batched): every key is claimed by exactly one of its two claimants,
// each gets its own answer, and commits land.
func TestRedisPipeConcurrentClaims(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	if s.pipe == nil {
		t.Fatal("no pipe on a standalone server")
	}
	ctx := context.Background()
	const keys = 300
	results := make([][2]dedup.ClaimResult, keys)
	var wg sync.WaitGroup
	errs := make(chan error, 2*keys)
	for i := range keys {
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := testKeyPrefix + "evt_c" + strconv.Itoa(i)
				tok := "tok" + strconv.Itoa(j)
				res, _, err := s.Claim(ctx, key, tok, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				results[i][j] = res
				if res == dedup.Claimed {
					if held, err := s.Commit(ctx, key, tok, dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "x"}, time.Hour); err != nil || !held {
						errs <- errors.Join(err, errors.New("commit not held"))
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, r := range results {
		if (r[0] == dedup.Claimed) == (r[1] == dedup.Claimed) {
			t.Fatalf("key %d: claims %v and %v, want exactly one claimed", i, r[0], r[1])
		}
	}
	for i := range keys {
		if res, _, err := s.Claim(ctx, testKeyPrefix+"evt_c"+strconv.Itoa(i), "tok9", time.Minute); err != nil || res != dedup.AlreadyDone {
			t.Fatalf("key %d after commit: %v %v", i, res, err)
		}
	}
}

// TestRedisPipeSurvivesKilledConnection: a connection that Redis closed
// while idle (a restart, CLIENT KILL, a timeout) costs no failed
// request: the command goes out on a new one.
func TestRedisPipeSurvivesKilledConnection(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	for i := range 5 {
		if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_k"+strconv.Itoa(i), "tok", time.Minute); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisPipeTimeout: a Redis that does not answer within read_timeout
// fails the claim (503, never a duplicate), and the next claims work once
// it answers again.
func TestRedisPipeTimeout(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, ReadTimeout: caddy.Duration(200 * time.Millisecond)})
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_t0", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "1500", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	res, _, err := s.Claim(ctx, testKeyPrefix+"evt_t1", "tok", time.Minute)
	var ne interface{ Timeout() bool }
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("claim while Redis is paused: %v %v, want a timeout", res, err)
	}
	waitFor(t, "claims working after the pause", func() bool {
		res, _, err := s.Claim(ctx, testKeyPrefix+"evt_t2", "tok", time.Minute)
		return err == nil && res == dedup.Claimed
	})
}

// TestRedisPipeErrorReply: an error reply fails its own command only;
// the connection and the commands around it go on.
func TestRedisPipeErrorReply(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	bad := testKeyPrefix + "evt_list"
	if err := admin.LPush(ctx, bad, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_e0", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	conn := currentConn(s)
	res, _, err := s.Claim(ctx, bad, "tok", time.Minute)
	var re goredis.Error
	if err == nil || !errors.As(err, &re) || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Fatalf("claim of a list key: %v %v, want WRONGTYPE", res, err)
	}
	if res, _, err := s.Claim(ctx, testKeyPrefix+"evt_e1", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after an error reply: %v %v", res, err)
	}
	if currentConn(s) != conn {
		t.Fatal("an error reply cost the connection")
	}
}

// TestReadReply: every RESP2 and RESP3 type the store may meet, and
// malformed input refused.
func TestReadReply(t *testing.T) {
	read := func(in string) (reply, error) {
		return readReply(bufio.NewReader(strings.NewReader(in)), 0)
	}
	for in, want := range map[string]reply{
		"+OK\r\n":            {kind: '+', str: "OK"},
		"-ERR x\r\n":         {kind: '-', str: "ERR x"},
		":-2\r\n":            {kind: ':', num: -2},
		"$5\r\nhello\r\n":    {kind: '$', str: "hello"},
		"$0\r\n\r\n":         {kind: '$', str: ""},
		"$-1\r\n":            {kind: '_'},
		"*-1\r\n":            {kind: '_'},
		"_\r\n":              {kind: '_'},
		"#t\r\n":             {kind: '#', num: 1},
		",1.5\r\n":           {kind: ',', str: "1.5"},
		"(123\r\n":           {kind: '(', str: "123"},
		"=8\r\ntxt:abcd\r\n": {kind: '=', str: "abcd"},
		"!3\r\nBAD\r\n":      {kind: '-', str: "BAD"},
	} {
		got, err := read(in)
		if err != nil || got.kind != want.kind || got.str != want.str || got.num != want.num {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	push, err := read(">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n")
	if err != nil || push.kind != '>' || len(push.elems) != 2 || push.elems[0].str != "invalidate" || len(push.elems[1].elems) != 2 || push.elems[1].elems[1].str != "b" {
		t.Fatalf("push: %+v %v", push, err)
	}
	flush, err := read(">2\r\n$10\r\ninvalidate\r\n_\r\n")
	if err != nil || !flush.elems[1].isNull() {
		t.Fatalf("invalidate all: %+v %v", flush, err)
	}
	m, err := read("|1\r\n+a\r\n+b\r\n%1\r\n+k\r\n:1\r\n")
	if err != nil || m.kind != '%' || len(m.elems) != 2 || m.elems[1].num != 1 {
		t.Fatalf("map after an attribute: %+v %v", m, err)
	}
	for _, in := range []string{"", "\r\n", "?x\r\n", ":x\r\n", "$5\r\nab\r\n", "$2\r\nabXY", "+OK\n", "*99999999\r\n", "$99999999999\r\n",
		strings.Repeat("*1\r\n", 20) + ":1\r\n"} {
		if _, err := read(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// TestRedisPipeRepliesReachTheirCallers: 64 callers at once, each
// claiming a key of its own and then asking again under another token,
// while the server kills the pipe's connections every few milliseconds.
// The reading passes from caller to caller; every caller must get its
// own reply (the second claim sees the first claim's token, never
// another key's), or an error, and none may wait for ever.
func TestRedisPipeRepliesReachTheirCallers(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	const callers, rounds = 64, 300
	stop := make(chan struct{})
	killed := make(chan int)
	go func() {
		n := 0
		defer func() { killed <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err() == nil {
				n++
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var answered, failed int
	var wrong []string
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				key := testKeyPrefix + "evt_h" + strconv.Itoa(c) + "_" + strconv.Itoa(r)
				tok := "tok" + strconv.Itoa(c) + "_" + strconv.Itoa(r)
				res, _, err := s.Claim(ctx, key, tok, time.Minute)
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				res2, found, err := s.Claim(ctx, key, "other", time.Minute)
				mu.Lock()
				switch {
				case err != nil:
					failed++
				case res != dedup.Claimed:
					wrong = append(wrong, key+": first claim "+res.String())
				case res2 != dedup.InFlight || found != dedup.InFlightPrefix+tok:
					wrong = append(wrong, key+": second claim "+res2.String()+" "+found)
				default:
					answered++
				}
				mu.Unlock()
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		t.Fatal("callers still waiting for replies after 60s: a reply or the turn to read was lost")
	}
	close(stop)
	kills := <-killed
	if len(wrong) > 0 {
		t.Fatalf("%d callers got a reply that was not theirs, e.g. %v", len(wrong), wrong[:min(3, len(wrong))])
	}
	if kills == 0 || answered == 0 {
		t.Fatalf("kills %d, answered %d: the test did not exercise both", kills, answered)
	}
	t.Logf("%d answered, %d failed with an error, %d connections killed", answered, failed, kills)
}

// currentConn is the connection the store's pipe sends on now.
func currentConn(s *Store) *pipeConn {
	s.pipe.mu.Lock()
	defer s.pipe.mu.Unlock()
	return s.pipe.conn
}
