// Command redisab is issue 17's request-level A/B of the Redis store's
// standalone client: the store's own pipe against go-redis's
// auto-pipeliner, each in a real Caddy driven by wrk, side by side in one
// run against one redis-server on loopback.
//
// It needs a Caddy built with the throwaway switch SANGHO_AB_REDIS_CLIENT
// (branch wt-redisab only, see bench/REDIS-CLIENT-AB.md): one binary,
// started once per variant with that variable set, so that A and B are
// the same bytes but for the client they pick.
//
//	go build -o /tmp/redisab-caddy ./cmd/caddy
//	go run ./bench/redisab --caddy /tmp/redisab-caddy --variants pipe,ap-fd,ap-fd-delay
//
// Each load run takes /tmp/bench.lock (flock) for the CPU snapshots and
// the wrk run, as `flock /tmp/bench.lock wrk ...` would.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/load"
	"github.com/sangho/caddy-sangho-dedup/internal/sangho"
)

const secret = "whsec_bench_secret"

// The event body, as load.Body builds it (1 KiB), around its ID.
const (
	bodyHead = `{"id":"`
	typ      = "payment_intent.succeeded"
)

var bodyTail = `","object":"event","type":"` + typ + `","created":1700000000,"data":{"object":{"pad":"` +
	strings.Repeat("x", 1024-90) + `"}}}`

// luaScript sends the requests of the file named by $AB_REQS ("id
// signature" lines) in order, each body bodyHead..id..bodyTail, built in
// init so that a request costs wrk a table look-up. Past the end it
// starts again (the duplicates scenario wants that; the others are sized
// never to get there, and the driver checks).
const luaScript = `
local reqs, n, i = {}, 0, 0
function init(args)
  local tail = os.getenv("AB_TAIL")
  for line in io.lines(os.getenv("AB_REQS")) do
    local id, sig = line:match("^(%S+) (%S+)$")
    n = n + 1
    reqs[n] = wrk.format("POST", "/", {["Content-Type"] = "application/json",
      ["Sangho-Event-ID"] = id, ["Sangho-Signature"] = sig}, '{"id":"' .. id .. tail)
  end
end
function request()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
function done(summary, latency, requests)
  io.write(string.format("AB %d %d %d %d %.0f %.0f %.0f\n", summary.requests, summary.duration,
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
`

type result struct {
	rps, p50, p99, max     float64 // p in µs
	requests, non2xx, errs int
	caddyCPU, redisCPU     float64 // µs per request
	cmds                   float64 // Redis commands per request
}

func main() {
	caddyBin := flag.String("caddy", "/tmp/redisab-caddy", "Caddy built from this branch (go build ./cmd/caddy)")
	variants := flag.String("variants", "pipe,ap-fd", "values of SANGHO_AB_REDIS_CLIENT, the first the baseline")
	scenarios := flag.String("scenarios", "new,redeliver,dup", "new: every event new; redeliver: each event redelivered 1 to 3 times, spread over the next 4,096 events; dup: 100 % duplicates of a ring of 256 done events")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	dur := flag.Duration("duration", 5*time.Second, "length of each wrk run")
	conns := flag.Int("connections", 32, "wrk connections (1 thread)")
	perRun := flag.Int("requests", 150000, "requests prepared per run (must exceed what a run sends)")
	flag.Parse()
	if err := run(*caddyBin, strings.Split(*variants, ","), strings.Split(*scenarios, ","), *rounds, *dur, *conns, *perRun); err != nil {
		fmt.Fprintln(os.Stderr, "redisab:", err)
		os.Exit(1)
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(addr string) error {
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("%s did not open within 15s", addr)
}

// cpuTicks returns utime+stime of a process in clock ticks (1/100 s).
func cpuTicks(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return u + s
}

// redisCalls sums the calls of the commands requests send.
func redisCalls(c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		name := strings.TrimPrefix(line[:strings.IndexByte(line, ':')], "cmdstat_")
		if name == "info" || name == "hello" || name == "client|setinfo" || name == "ping" || name == "client|tracking" {
			continue
		}
		i := strings.Index(line, "calls=")
		j := strings.IndexByte(line[i:], ',')
		n, _ := strconv.ParseInt(line[i+6:i+j], 10, 64)
		total += n
	}
	return total
}

// plan returns the event numbers of n deliveries.
func plan(scenario string, n int, rng *rand.Rand) []int {
	switch scenario {
	case "new":
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		return p
	case "dup":
		p := make([]int, 256)
		for i := range p {
			p[i] = i
		}
		return p
	case "redeliver":
		// As BenchmarkRedisRealisticRedelivery: event e first at e*8,
		// then 1 to 3 redeliveries at e*8+8+[0, 4096*8).
		type timed struct{ at, event int }
		var all []timed
		for e := 0; len(all) < 2*n; e++ {
			all = append(all, timed{e * 8, e})
			for range 1 + rng.IntN(3) {
				all = append(all, timed{e*8 + 8 + rng.IntN(4096*8), e})
			}
		}
		slices.SortStableFunc(all, func(a, b timed) int { return a.at - b.at })
		p := make([]int, n)
		for i := range p {
			p[i] = all[i].event
		}
		return p
	}
	panic("unknown scenario " + scenario)
}

// writeRequests writes one signed request per delivery, "id signature".
func writeRequests(path, prefix string, events []int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	now := time.Now()
	sigs := map[int]string{}
	for _, e := range events {
		id := prefix + strconv.Itoa(e)
		sig, ok := sigs[e]
		if !ok {
			sig = sangho.Sign(now, []byte(bodyHead+id+bodyTail), secret)
			sigs[e] = sig
		}
		fmt.Fprintf(w, "%s %s\n", id, sig)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// lock takes /tmp/bench.lock, as flock(1) does.
func lock() (unlock func(), err error) {
	f, err := os.OpenFile("/tmp/bench.lock", os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func run(caddyBin string, variants, scenarios []string, rounds int, dur time.Duration, conns, perRun int) error {
	tmp, err := os.MkdirTemp("", "redisab")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	start := func(env []string, logName, name string, args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(name, args...)
		logf, _ := os.Create(filepath.Join(tmp, logName+".log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
		return cmd, nil
	}
	redisPort, backendPort := freePort(), freePort()
	rs, err := start(nil, "redis", "redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp)
	if err != nil {
		return err
	}
	backend := "127.0.0.1:" + strconv.Itoa(backendPort)
	go func() { _ = load.NewSink(backend).ListenAndServe() }()
	ports := map[string]int{}
	caddys := map[string]*exec.Cmd{}
	for _, v := range variants {
		ports[v] = freePort()
		cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\tlevel WARN\n\t}\n}\n"+
			"http://127.0.0.1:%d {\n\tbind 127.0.0.1\n\tsangho_dedup {\n\t\tsecret %s\n\t\tmax_body_size 2MiB\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:%d\n\t\t}\n\t\tname redis\n\t}\n\treverse_proxy %s\n}\n",
			ports[v], secret, redisPort, backend)
		path := filepath.Join(tmp, v+".Caddyfile")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return err
		}
		c, err := start([]string{"SANGHO_AB_REDIS_CLIENT=" + v, "GOMAXPROCS=2"}, "caddy-"+v, caddyBin, "run", "--config", path, "--adapter", "caddyfile")
		if err != nil {
			return err
		}
		caddys[v] = c
	}
	for _, a := range []string{backend, "127.0.0.1:" + strconv.Itoa(redisPort)} {
		if err := waitPort(a); err != nil {
			return err
		}
	}
	for _, v := range variants {
		if err := waitPort("127.0.0.1:" + strconv.Itoa(ports[v])); err != nil {
			log, _ := os.ReadFile(filepath.Join(tmp, "caddy-"+v+".log"))
			return fmt.Errorf("%s: %v\n%s", v, err, log)
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(redisPort)})
	defer rc.Close()
	script := filepath.Join(tmp, "ab.lua")
	if err := os.WriteFile(script, []byte(luaScript), 0o600); err != nil {
		return err
	}
	hc := load.Client(4, 10*time.Second)

	results := map[string]map[string][]result{} // scenario, variant
	for _, s := range scenarios {
		results[s] = map[string][]result{}
	}
	nonce := strconv.FormatInt(time.Now().Unix()%100000, 10)
	for r := range rounds {
		for _, s := range scenarios {
			// rotate the order each round: A,B,C then B,C,A ...
			order := append(slices.Clone(variants[r%len(variants):]), variants[:r%len(variants)]...)
			for _, v := range order {
				rng := rand.New(rand.NewPCG(uint64(r), 7)) // the same plan for every variant of a round
				prefix := fmt.Sprintf("evt_%s_%s_%s_r%d_", nonce, v, s, r)
				events := plan(s, perRun, rng)
				reqs := filepath.Join(tmp, "reqs.txt")
				if err := writeRequests(reqs, prefix, events); err != nil {
					return err
				}
				url := "http://127.0.0.1:" + strconv.Itoa(ports[v]) + "/"
				if s == "dup" { // deliver the ring once: then every request is a duplicate
					for _, e := range events {
						id := prefix + strconv.Itoa(e)
						body := []byte(bodyHead + id + bodyTail)
						if code, _, _, err := load.Send(context.Background(), hc, url, load.Delivery{ID: id, Body: body, Signature: sangho.Sign(time.Now(), body, secret)}); err != nil || code != 200 {
							return fmt.Errorf("%s: warm-up answered %d %v", v, code, err)
						}
					}
				}
				res, err := measure(caddys[v].Process.Pid, rs.Process.Pid, rc, script, reqs, url, dur, conns)
				if err != nil {
					return fmt.Errorf("%s %s: %w", v, s, err)
				}
				if s != "dup" && res.requests >= len(events) {
					return fmt.Errorf("%s %s: wrk sent %d requests, only %d prepared: raise --requests", v, s, res.requests, len(events))
				}
				results[s][v] = append(results[s][v], res)
				fmt.Fprintf(os.Stderr, "round %d %-9s %-12s %7.0f req/s p50 %6.0f µs p99 %6.0f µs Caddy %5.1f µs/req redis %4.1f µs/req %.2f cmds/req non-2xx %d errors %d\n",
					r+1, s, v, res.rps, res.p50, res.p99, res.caddyCPU, res.redisCPU, res.cmds, res.non2xx, res.errs)
			}
		}
	}
	fmt.Print(report(results, variants, scenarios, rounds, dur, conns))
	return nil
}

func measure(caddyPid, redisPid int, rc *redis.Client, script, reqs, url string, dur time.Duration, conns int) (result, error) {
	cmd := exec.Command("wrk", "-t1", "-c"+strconv.Itoa(conns), "-d"+dur.String(), "-s", script, url)
	cmd.Env = append(os.Environ(), "AB_REQS="+reqs, "AB_TAIL="+bodyTail)
	unlock, err := lock()
	if err != nil {
		return result{}, err
	}
	defer unlock()
	c0, r0, k0 := cpuTicks(caddyPid), cpuTicks(redisPid), redisCalls(rc)
	out, err := cmd.Output()
	c1, r1, k1 := cpuTicks(caddyPid), cpuTicks(redisPid), redisCalls(rc)
	if err != nil {
		return result{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	var res result
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "AB ") {
			continue
		}
		var durUS int
		if _, err := fmt.Sscanf(line, "AB %d %d %d %d %f %f %f", &res.requests, &durUS, &res.non2xx, &res.errs, &res.p50, &res.p99, &res.max); err != nil {
			return result{}, fmt.Errorf("wrk output %q: %v", line, err)
		}
		res.rps = float64(res.requests) / (float64(durUS) / 1e6)
	}
	if res.requests == 0 {
		return result{}, fmt.Errorf("no requests: %s", out)
	}
	n := float64(res.requests)
	res.caddyCPU = (c1 - c0) * 10000 / n // ticks are 10 ms
	res.redisCPU = (r1 - r0) * 10000 / n
	res.cmds = float64(k1-k0) / n
	return res, nil
}

func median(xs []float64) float64 {
	ys := slices.Clone(xs)
	sort.Float64s(ys)
	if len(ys)%2 == 1 {
		return ys[len(ys)/2]
	}
	return (ys[len(ys)/2-1] + ys[len(ys)/2]) / 2
}

func field(rs []result, f func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func spread(xs []float64, format string) string {
	return fmt.Sprintf(format+" ("+format+"–"+format+")", median(xs), slices.Min(xs), slices.Max(xs))
}

func report(results map[string]map[string][]result, variants, scenarios []string, rounds int, dur time.Duration, conns int) string {
	var b strings.Builder
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	fmt.Fprintf(&b, "- date: %s; commit: %s; %d interleaved rounds of %v, wrk -t1 -c%d; baseline %s\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), strings.TrimSpace(string(commit)), rounds, dur, conns, variants[0])
	fmt.Fprintf(&b, "| scenario | client | req/s | × %s (same round) | Caddy CPU µs/req | Δ µs/req vs %s | p99 ms | redis CPU µs/req | Redis cmds/req | non-2xx |\n|---|---|---|---|---|---|---|---|---|---|\n", variants[0], variants[0])
	for _, s := range scenarios {
		base := results[s][variants[0]]
		for _, v := range variants {
			rs := results[s][v]
			var ratio, delta []float64
			for i := range min(len(rs), len(base)) {
				ratio = append(ratio, rs[i].rps/base[i].rps)
				delta = append(delta, rs[i].caddyCPU-base[i].caddyCPU)
			}
			non2xx := 0
			for _, r := range rs {
				non2xx += r.non2xx
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %s | %s | %.1f | %.2f | %d |\n", s, v,
				median(field(rs, func(r result) float64 { return r.rps })), spread(ratio, "%.2f"),
				spread(field(rs, func(r result) float64 { return r.caddyCPU }), "%.1f"), spread(delta, "%+.1f"),
				spread(field(rs, func(r result) float64 { return r.p99 / 1000 }), "%.2f"),
				median(field(rs, func(r result) float64 { return r.redisCPU })),
				median(field(rs, func(r result) float64 { return r.cmds })), non2xx)
		}
	}
	return b.String()
}
