package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// benchBodies are the bodies of a run, as --bodies names them.
var benchBodies = []struct {
	name   string
	size   int
	nested bool
}{{"1KiB", 1024, false}, {"64KiB", 64 << 10, false}, {"64KiB-nested", 64 << 10, true}}

// checkEvent tells whether body is an event of the run: a JSON object
// of exactly size bytes whose top-level "id" is id, and, for the nested
// shape, at least 100 nested objects (one long string for the other).
func checkEvent(body []byte, id string, size int, nested bool) error {
	if len(body) != size {
		return fmt.Errorf("%d bytes, not %d", len(body), size)
	}
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("not a JSON object: %v", err)
	}
	if got, _ := v["id"].(string); got == "" || got != id {
		return fmt.Errorf("top-level id %q, not %q", got, id)
	}
	var objects func(x any) int
	objects = func(x any) int {
		n := 0
		switch x := x.(type) {
		case map[string]any:
			n++
			for _, y := range x {
				n += objects(y)
			}
		case []any:
			for _, y := range x {
				n += objects(y)
			}
		}
		return n
	}
	n := objects(v) - 1 // the event itself
	if nested && n < 100 {
		return fmt.Errorf("%d nested objects, want at least 100", n)
	}
	if !nested && n > 5 {
		return fmt.Errorf("%d nested objects: not one long string", n)
	}
	return nil
}

// The data file that wrk sends from holds, for each body of a run,
// events that sangho_dedup accepts: each body (prefix + ID + suffix) is
// valid JSON of exactly the size asked for, its top-level "id" the
// event's ID, unique to the event, signed over these bytes; the nested
// one is many small objects, the root package's push (the same
// generator), and the others one long string.
func TestWrkDataBodies(t *testing.T) {
	const secret = "whsec_test"
	for _, b := range benchBodies {
		t.Run(b.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "data")
			cfg := load.Config{Secret: secret, BodySize: b.size, Nested: b.nested}
			if _, err := wrkData(context.Background(), path, cfg, 40); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			sc.Scan()
			prefix := sc.Text()
			sc.Scan()
			suffix := sc.Text()
			seen := map[string]bool{}
			for sc.Scan() {
				kind, rest, _ := strings.Cut(sc.Text(), " ")
				id, sig, _ := strings.Cut(rest, " ")
				body := []byte(prefix + id + suffix)
				if kind != "n" || seen[id] {
					t.Fatalf("line %q: not a new event, or its ID again", sc.Text())
				}
				seen[id] = true
				if err := checkEvent(body, id, b.size, b.nested); err != nil {
					t.Fatalf("event %s: %v", id, err)
				}
				ts, _, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",")
				sec, _ := strconv.ParseInt(ts, 10, 64)
				if sig != sangho.Sign(time.Unix(sec, 0), body, secret) {
					t.Fatalf("event %s: the signature is not over its body", id)
				}
				if b.nested && string(body) != load.NestedBodySize(id, b.size) {
					t.Fatalf("event %s: not the push of load.NestedBodySize", id)
				}
			}
			if err := sc.Err(); err != nil || len(seen) != 40 {
				t.Fatalf("%d events in the data file, %v", len(seen), err)
			}
		})
	}
}

// --bodies takes each body of the run by the name the report gives it,
// and one it does not know is refused before anything starts, with the
// names it knows.
func TestBodiesFlag(t *testing.T) {
	for _, b := range benchBodies {
		s := &scenario{body: b.size, nested: b.nested}
		if s.bodyName() != b.name || !strings.Contains(s.name(), " body "+b.name+" ") {
			t.Errorf("scenario of %s is named %q, %q", b.name, s.bodyName(), s.name())
		}
	}
	bodies = "64KiB-deep"
	defer func() { bodies = "" }()
	err := run(os.Args[0], "", "", time.Second, 1, 1, 1, "memory", "", "", false, 0)
	if err == nil || !strings.Contains(err.Error(), `--bodies: "64KiB-deep" is not a body of the run (1KiB, 64KiB, 64KiB-nested)`) {
		t.Errorf("--bodies 64KiB-deep: %v", err)
	}
}

// --only takes the targets of the run by name; one it does not know is
// refused before anything starts. (Found by review: --only foo ran the
// baselines alone and wrote an empty table.)
func TestOnlyFlag(t *testing.T) {
	err := run(os.Args[0], "", "", time.Second, 1, 1, 1, "memory,foo", "", "", false, 0)
	if err == nil || !strings.Contains(err.Error(), `--only: "foo" is not a target`) || !strings.Contains(err.Error(), "postgres") {
		t.Errorf("--only memory,foo: %v", err)
	}
}

// Every site of the benchmark's Caddy accepts the bodies of each shape
// as wrk sends them: sangho_dedup on each store passes a new event on
// and answers its redelivery as a duplicate, the floor and the
// baselines answer 200. Runs the benchmark's own config in this
// process (without PostgreSQL; Redis unless -short).
func TestBenchSitesAcceptBodies(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	backend := fmt.Sprintf("127.0.0.1:%d", netkit.FreePort(t))
	ln, err := net.Listen("tcp", backend)
	if err != nil {
		t.Fatal(err)
	}
	sink := load.NewSink(backend)
	go func() { _ = sink.Serve(ln) }()
	t.Cleanup(func() { _ = sink.Close() })
	targets := []string{"reverse_proxy", "respond", "hmacfloor", "floor_respond", "memory", "file"}
	var redisPort int
	if testing.Short() {
		redisPort = netkit.FreePort(t) // provisioned, not sent to
	} else {
		redisPort = redistest.Start(t).Port
		targets = append(targets, "redis")
	}
	var ports [6]int
	for i := range ports {
		ports[i] = netkit.FreePort(t)
	}
	floor := [2]int{netkit.FreePort(t), netkit.FreePort(t)}
	cfg := benchCaddyfile(ports, floor, backend, redisPort, "", filepath.Join(t.TempDir(), "dedup.db"), "", "")
	cfg = strings.Replace(cfg, "\tlog {\n\t\tlevel ERROR\n\t}", "\tlog {\n\t\toutput discard\n\t}", 1)
	if err := handlertest.Load(t, cfg); err != nil {
		t.Fatal(err)
	}
	port := map[string]int{"reverse_proxy": ports[0], "memory": ports[1], "redis": ports[2], "file": ports[3], "respond": ports[4],
		"hmacfloor": floor[0], "floor_respond": floor[1]}
	client := load.Client(1, 10*time.Second)
	defer client.CloseIdleConnections()
	for _, b := range benchBodies {
		for _, target := range targets {
			id := fmt.Sprintf("evt_%s_%s", strings.ReplaceAll(b.name, "-", ""), target)
			prefix, suffix := wrkBody("payment_intent.succeeded", b.size, len(id), b.nested)
			body := []byte(prefix + id + suffix)
			if err := checkEvent(body, id, b.size, b.nested); err != nil {
				t.Fatalf("%s: %v", b.name, err)
			}
			d := load.NewDelivery(id, body, secret)
			url := fmt.Sprintf("http://127.0.0.1:%d/", port[target])
			for i, want := range []string{"", "duplicate"} {
				status, dedup, _, err := load.Send(context.Background(), client, url, d)
				if !isDeduped(target) {
					want = ""
				}
				if err != nil || status != 200 || dedup != want {
					t.Errorf("%s, %s, delivery %d: status %d, Sangho-Dedup %q, %v; want 200 %q", b.name, target, i+1, status, dedup, err, want)
				}
			}
		}
	}
}

// A run starts the store servers of its targets only: --only memory (or
// file) needs no redis-server and no PostgreSQL on the machine. (Noticed
// by several sessions' notes: it asked for redis-server whatever --only
// said.)
func TestOnlyStartsItsServers(t *testing.T) {
	for _, c := range []struct {
		only            string
		redis, postgres bool
	}{
		{"", true, true},
		{"memory", false, false},
		{"file,memory", false, false},
		{"redis", true, false},
		{"postgres", false, true},
		{"memory,redis,postgres", true, true},
	} {
		redis, postgres := storeServers(c.only)
		if redis != c.redis || postgres != c.postgres {
			t.Errorf("--only %q starts redis %v, postgres %v; want %v, %v", c.only, redis, postgres, c.redis, c.postgres)
		}
	}
	// A target that needs redis-server still says so when it is missing.
	t.Setenv("PATH", t.TempDir())
	err := run(os.Args[0], "", "", time.Second, 1, 1, 1, "memory,redis", "", "", false, 0)
	if err == nil || !strings.Contains(err.Error(), "redis-server not found") {
		t.Errorf("--only memory,redis without redis-server: %v", err)
	}
}
