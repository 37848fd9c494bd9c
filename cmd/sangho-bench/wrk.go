package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// wrkScript posts the events that wrkData signed beforehand.
//
//go:embed wrk.lua
var wrkScript []byte

// wrkRun is one wrk run of cfg (a throughput run: wrk has no fixed
// rate) with one thread and cfg.Concurrency connections, the way a user
// would drive an endpoint. wrk takes far less CPU per request than the
// Go generator, which shares the same cores with Caddy.
//
// Events are signed here before the run, and wrk.lua builds every
// request before the run too. For a target that dedups (unique), as
// many new events as wrk could send at wrkMaxRate for the whole run,
// within wrkMemory: a run that used them all would have sent some
// twice, and is an error rather than a wrong figure. Other targets
// reuse a few.
func wrkRun(ctx context.Context, wrk, dir string, cfg load.Config, unique bool) (load.Result, error) {
	script := filepath.Join(dir, "sangho-bench-wrk.lua")
	if err := os.WriteFile(script, wrkScript, 0o600); err != nil {
		return load.Result{}, err
	}
	n, memory := 1024, wrkMemory()
	if unique && cfg.Duplicates < 1 {
		n = wrkEvents(cfg.BodySize, cfg.Duration, cfg.Concurrency, memory)
	}
	data := filepath.Join(dir, "sangho-bench-wrk.data")
	warm, err := wrkData(ctx, data, cfg, n)
	if err != nil {
		return load.Result{}, err
	}
	cmd := exec.CommandContext(ctx, wrk, "-t1", "-c"+strconv.Itoa(cfg.Concurrency),
		"-d"+strconv.Itoa(int(cfg.Duration.Seconds()))+"s", "--timeout", "30s",
		"-s", script, cfg.URL, "--", data, strconv.FormatFloat(cfg.Duplicates, 'f', -1, 64))
	out, err := runWrkCmd(cmd)
	if err != nil {
		return load.Result{}, err
	}
	res, exhausted, initCPU, err := parseWrk(out)
	if err != nil {
		return load.Result{}, err
	}
	if ps := cmd.ProcessState; ps != nil && res.Requests > 0 {
		// wrk's CPU over the run: its whole run's, less what init
		// (building the requests) had taken.
		res.GeneratorCPU = float64((ps.UserTime()+ps.SystemTime()).Microseconds()-initCPU) / float64(res.Requests)
	}
	if exhausted > 0 && unique {
		return load.Result{}, fmt.Errorf("wrk ran out of the %d signed new events (%d requests would have been redeliveries): "+
			"they are bounded by %.0f a second (wrkMaxRate) and by %d MiB of requests built beforehand (4 GiB or half the memory available); "+
			"shorten --duration", n, exhausted, wrkMaxRate(cfg.BodySize), memory>>20)
	}
	res.DupSent += warm
	return res, nil
}

// wrkReady is the line wrk.lua prints once its requests are built,
// as the load starts.
const wrkReady = "SANGHO_BENCH_READY"

// runWrkCmd runs wrk and returns its output (stdout, then stderr),
// calling loadStarts (if set) when wrk.lua says the load starts: after
// the events were signed and the requests built, so that what is
// counted from there (Caddy's CPU, its profile) is the load's alone.
func runWrkCmd(cmd *exec.Cmd) (string, error) {
	var out strings.Builder
	var stderr bytes.Buffer // written by exec's own goroutine
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("wrk: %v", err)
	}
	ready := false
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n') // no bound on a line's length
		if strings.TrimSuffix(line, "\n") == wrkReady && !ready {
			ready = true
			if loadStarts != nil {
				loadStarts()
			}
		} else {
			out.WriteString(line)
		}
		if err != nil { // io.EOF once wrk closes it; else drained below
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // so that wrk never blocks on a full pipe
	err = cmd.Wait()
	out.Write(stderr.Bytes())
	if err != nil {
		return "", fmt.Errorf("wrk: %v\n%s", err, out.String())
	}
	if !ready {
		return "", fmt.Errorf("wrk: the script never said its load started (no %s line):\n%s", wrkReady, out.String())
	}
	return out.String(), nil
}

// wrkData sends cfg.Warmup events (what redeliveries draw from at
// first), then writes wrk.lua's data file: the body around the event
// ID, the warmed events, and n new events, all signed now. Every ID of
// the run has the same length and the body's bytes are the same for
// every event but the ID, so that every body is cfg.BodySize bytes. It
// returns the number of warm-up requests.
func wrkData(ctx context.Context, path string, cfg load.Config, n int) (int, error) {
	typ := cfg.Type
	if typ == "" {
		typ = "payment_intent.succeeded"
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	width := len(strconv.Itoa(max(n, cfg.Warmup)))
	eventID := func(kind string, i int) string { return load.EventID(run, kind, width, i) }
	prefix, suffix := wrkBody(typ, cfg.BodySize, len(eventID("n", 0)), cfg.Nested)
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	fmt.Fprintf(w, "%s\n%s\n", prefix, suffix)
	now := time.Now()
	line := func(kind, id string) string {
		body := prefix + id + suffix
		return kind + " " + id + " " + sangho.Sign(now, []byte(body), cfg.Secret) + "\n"
	}
	if cfg.Warmup > 0 {
		client := load.Client(1, 30*time.Second)
		defer client.CloseIdleConnections()
		for i := range cfg.Warmup {
			id := eventID("w", i)
			body := prefix + id + suffix
			d := load.Delivery{ID: id, Body: []byte(body), Signature: sangho.Sign(now, []byte(body), cfg.Secret)}
			if status, _, _, err := load.Send(ctx, client, cfg.URL, d); err != nil || status/100 != 2 {
				return 0, fmt.Errorf("warm-up: status %d, %v", status, err)
			}
			w.WriteString(line("w", id))
		}
	}
	for i := range n {
		w.WriteString(line("n", eventID("n", i)))
	}
	if err := w.Flush(); err != nil {
		return 0, err
	}
	return cfg.Warmup, f.Close()
}

// wrkBody is an event body of size bytes for an ID of idLen bytes, cut
// around its "id": prefix + id + suffix is the body. The body is one
// long string, the ID last, or, if nested, load.NestedBodySize's push
// of many small commits, the ID first (as in the root package's
// benchmarks).
func wrkBody(typ string, size, idLen int, nested bool) (prefix, suffix string) {
	if nested {
		const head = `{"id":"`
		body := load.NestedBodySize(strings.Repeat("x", idLen), size)
		return head, body[len(head)+idLen:]
	}
	created := strconv.FormatInt(time.Now().Unix(), 10)
	head := `{"object":"event","type":"` + typ + `","created":` + created + `,"data":{"object":{"pad":"`
	tail := `"}},"id":"`
	pad := max(0, size-len(head)-len(tail)-len(`"}`)-idLen)
	return head + strings.Repeat("x", pad) + tail, `"}`
}

// wrkMaxRate bounds the new events per second that a run can use: 60k
// (wrk on respond does about 30k here), or 1 GB/s of bodies.
func wrkMaxRate(bodySize int) float64 {
	return min(60000, 1e9/float64(max(bodySize, 1)))
}

// wrkMemory bounds the memory of the requests wrk.lua builds before a
// run: 4 GiB (65,000 requests of 64 KiB: 13,000 a second over 5 s,
// where wrk with Caddy on two cores sends new 64 KiB events at up to
// 4,400 a second and reverse_proxy's at up to 7,200), or half the
// memory available, whichever is less.
func wrkMemory() int {
	limit := 4 << 30
	if avail := memAvailable(); avail > 0 {
		limit = min(limit, avail/2)
	}
	return limit
}

// memAvailable is /proc/meminfo's MemAvailable in bytes, or 0.
func memAvailable() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "MemAvailable:" && f[2] == "kB" {
			kb, _ := strconv.Atoi(f[1])
			return kb << 10
		}
	}
	return 0
}

// wrkEvents is the number of new events a run of d at concurrency c
// signs for a unique target: what wrk could send at wrkMaxRate, within
// memory bytes of requests (each its body and about 300 bytes of
// headers).
func wrkEvents(bodySize int, d time.Duration, c, memory int) int {
	return min(int(wrkMaxRate(bodySize)*d.Seconds())+c, memory/(bodySize+300))
}

// parseWrk reads the line wrk.lua's done() prints. It returns the
// result, how many requests found no new event left, and the CPU in µs
// that wrk had spent when its init ended.
func parseWrk(out string) (load.Result, int, int64, error) {
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "SANGHO_BENCH ") {
			line = l
		}
	}
	if line == "" {
		return load.Result{}, 0, 0, fmt.Errorf("wrk printed no SANGHO_BENCH line:\n%s", out)
	}
	v := map[string]int64{}
	for _, f := range strings.Fields(line)[1:] {
		k, s, ok := strings.Cut(f, "=")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil {
			return load.Result{}, 0, 0, fmt.Errorf("wrk: malformed field %q in %q", f, line)
		}
		v[k] = n
	}
	for _, k := range []string{"requests", "duration_us", "non2xx", "connect", "read", "write", "timeout", "p50_us", "p90_us", "p99_us", "max_us", "exhausted", "init_cpu_us"} {
		if _, ok := v[k]; !ok {
			return load.Result{}, 0, 0, fmt.Errorf("wrk: no %s in %q", k, line)
		}
	}
	if v["duration_us"] <= 0 {
		return load.Result{}, 0, 0, fmt.Errorf("wrk: duration %d µs in %q", v["duration_us"], line)
	}
	ms := func(k string) float64 { return float64(v[k]) / 1000 }
	r := load.Result{
		Requests: int(v["requests"]),
		Seconds:  float64(v["duration_us"]) / 1e6,
		P50:      ms("p50_us"), P90: ms("p90_us"), P99: ms("p99_us"), Max: ms("max_us"),
		ByStatus: map[string]int{}, ByDedup: map[string]int{},
	}
	r.Throughput = float64(r.Requests) / r.Seconds
	if ok := v["requests"] - v["non2xx"]; ok > 0 {
		r.ByStatus["2xx"] = int(ok)
	}
	if v["non2xx"] > 0 {
		r.ByStatus["non-2xx"] = int(v["non2xx"])
	}
	if e := v["connect"] + v["read"] + v["write"] + v["timeout"]; e > 0 {
		r.ByStatus["error"] = int(e)
	}
	r.NewSent = int(v["fresh_used"])
	return r, int(v["exhausted"]), v["init_cpu_us"], nil
}
