// Package load sends signed Sangho events at an endpoint, with a chosen
// share of redeliveries, and measures what comes back. It is the engine
// of `sangho-send load` and of the benchmark suite.
package load

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Config of a load run.
type Config struct {
	URL         string
	Secret      string
	Concurrency int           // parallel connections
	Duration    time.Duration // run this long (0: until Events are sent)
	Events      int           // send this many requests (0: until Duration)
	Duplicates  float64       // share of requests that redeliver an event already sent (0..1)
	BodySize    int           // approximate body size in bytes (exact with Nested)
	Nested      bool          // bodies of many small nested values (NestedBodySize), not Body's one long string
	Rate        float64       // requests per second in all (0: as fast as possible)
	Warmup      int           // events sent before measuring, the pool duplicates draw from at first
	Timeout     time.Duration // per request
	Type        string        // event type
}

// Result of a load run.
type Result struct {
	Requests   int     `json:"requests"`
	Seconds    float64 `json:"seconds"`
	Throughput float64 `json:"throughput_rps"`
	// The latency quantiles: each request from its send to the end of
	// its answer; at a Rate, from its due time (see PacedStart), so that
	// a request held behind a slow one counts the wait (LatencyFrom
	// "due"; else "send").
	LatencyFrom string  `json:"latency_from"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	Max         float64 `json:"max_ms"`
	// Unsent: at a Rate, requests due before the end of the Duration
	// that could not be sent within Timeout after it (the server was
	// that far behind). Not in Requests, ByStatus nor Throughput; their
	// waits are in the latency quantiles. Seconds runs until the last
	// answer, Timeout at most after the end.
	Unsent   int            `json:"unsent,omitempty"`
	ByStatus map[string]int `json:"by_status"`
	ByDedup  map[string]int `json:"by_dedup"`
	NewSent  int            `json:"new_events"`
	DupSent  int            `json:"duplicate_deliveries"`
	// GeneratorCPU is the load generator's CPU (user + system) per
	// request in µs, when it ran in a process of its own (wrk): its
	// whole run, less its start (reading the signed events, building
	// the requests); 0 if unknown. On a machine whose cores it shares with Caddy, what it
	// takes is not Caddy's: a stream that costs it more lowers Caddy's
	// req/s without Caddy doing more.
	GeneratorCPU float64 `json:"generator_cpu_us_per_request,omitempty"`
}

// Body builds an event body of about size bytes for id.
func Body(id, typ string, size int) []byte {
	const head = `{"id":"","object":"event","type":"","created":0,"data":{"object":{"pad":""}}}`
	pad := size - len(head) - len(id) - len(typ) - 10
	if pad < 0 {
		pad = 0
	}
	var b bytes.Buffer
	b.Grow(size + 16)
	b.WriteString(`{"id":"`)
	b.WriteString(id)
	b.WriteString(`","object":"event","type":"`)
	b.WriteString(typ)
	b.WriteString(`","created":`)
	b.WriteString(strconv.FormatInt(time.Now().Unix(), 10))
	b.WriteString(`,"data":{"object":{"pad":"`)
	b.WriteString(strings.Repeat("x", pad))
	b.WriteString(`"}}}`)
	return b.Bytes()
}

// Client returns an HTTP client for c connections to one host.
func Client(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        conns * 2,
			MaxIdleConnsPerHost: conns * 2,
			MaxConnsPerHost:     conns * 2,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// Delivery is one signed request: ID, body and signature.
type Delivery struct {
	ID        string
	Body      []byte
	Signature string
}

// NewDelivery signs body now with secret.
func NewDelivery(id string, body []byte, secret string) Delivery {
	return Delivery{ID: id, Body: body, Signature: sangho.Sign(time.Now(), body, secret)}
}

// Send posts one delivery and returns the status, the Sangho-Dedup
// header and the time it took.
func Send(ctx context.Context, c *http.Client, url string, d Delivery) (int, string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.Body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sangho-Event-ID", d.ID)
	req.Header.Set("Sangho-Signature", d.Signature)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", time.Since(start), err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Sangho-Dedup"), time.Since(start), nil
}

// pool remembers recently sent events (delivered or still in flight) for
// redeliveries. A redelivery reuses the event's body and signature: the
// same bytes, as Sangho does (its t changes, which the plugin ignores for
// dedup; it stays inside the tolerance for runs shorter than it).
type pool struct {
	mu   sync.Mutex
	ring []Delivery
	next int
	full bool
}

func (p *pool) add(d Delivery) {
	p.mu.Lock()
	p.ring[p.next] = d
	p.next++
	if p.next == len(p.ring) {
		p.next, p.full = 0, true
	}
	p.mu.Unlock()
}

func (p *pool) pick(r *rand.Rand) (Delivery, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.next
	if p.full {
		n = len(p.ring)
	}
	if n == 0 {
		return Delivery{}, false
	}
	return p.ring[r.IntN(n)], true
}

// Run performs a load run.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Type == "" {
		cfg.Type = "payment_intent.succeeded"
	}
	if cfg.Duration == 0 && cfg.Events == 0 {
		return Result{}, fmt.Errorf("give a duration or a number of events")
	}
	client := Client(cfg.Concurrency, cfg.Timeout)
	defer client.CloseIdleConnections()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var seq atomic.Int64
	newDelivery := func() Delivery {
		id := EventID(run, "n", 0, int(seq.Add(1)))
		if cfg.Nested {
			return NewDelivery(id, []byte(NestedBodySize(id, cfg.BodySize)), cfg.Secret)
		}
		return NewDelivery(id, Body(id, cfg.Type, cfg.BodySize), cfg.Secret)
	}
	recent := &pool{ring: make([]Delivery, 256)}
	// Warm-up: the first events, sent before measuring, so that a run
	// of 100 % duplicates has something to redeliver.
	for range cfg.Warmup {
		d := newDelivery()
		if _, _, _, err := Send(ctx, client, cfg.URL, d); err != nil {
			return Result{}, fmt.Errorf("warm-up: %w", err)
		}
		recent.add(d)
	}

	// Without a rate, the run ends at its Duration: no request starts
	// after it, and one still in flight then is not counted; it is let
	// finish (until cfg.Timeout after the end), not cut: a delivery cut
	// by its client after its claim is held by sangho_dedup until
	// lock_ttl (an "event held" warning), as a real sender's would be.
	// The run's Seconds stop at the end. At a rate, the tokens
	// due before the end are all handed out and their requests sent and
	// counted, however far behind the server is, until cfg.Timeout after
	// the end (late): a slow answer near the end delays the requests due
	// behind it as it would anywhere else. A token not sent by then
	// counts as unsent, with its wait (Result.Unsent).
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var end time.Time
	late := context.Background() // never done without a Duration
	finish := ctx                // without a rate: what bounds a request in flight at the end
	if cfg.Duration > 0 {
		end = time.Now().Add(cfg.Duration)
		if cfg.Rate > 0 {
			late, cancel = context.WithDeadline(ctx, end.Add(cfg.Timeout))
		} else {
			runCtx, cancel = context.WithDeadline(runCtx, end)
			var cancelFinish context.CancelFunc
			finish, cancelFinish = context.WithDeadline(ctx, end.Add(cfg.Timeout))
			defer cancelFinish()
		}
		defer cancel()
	}
	var p *pacer
	var tokens <-chan token
	if cfg.Rate > 0 {
		p = pace(runCtx, late, cfg.Rate, end)
		tokens = p.ch
	}
	var remaining atomic.Int64
	remaining.Store(int64(cfg.Events))

	type workerResult struct {
		lat, unsent    []time.Duration
		status, dedup  map[string]int
		newSent, dupes int
	}
	results := make([]workerResult, cfg.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			res := workerResult{status: map[string]int{}, dedup: map[string]int{}}
			var fresh Delivery // made before it falls due
			var freshAt time.Time
			for tokens != nil || runCtx.Err() == nil {
				if cfg.Events > 0 && remaining.Add(-1) < 0 {
					break
				}
				// A new event's body is made and signed before its
				// token is taken: the generator's work, not the
				// server's. (A redelivery is picked once it is due.)
				dupWanted := cfg.Duplicates > 0 && r.Float64() < cfg.Duplicates
				if !dupWanted && fresh.ID == "" && late.Err() == nil {
					fresh, freshAt = newDelivery(), time.Now()
				}
				var began time.Time // at a rate: when the request counts from
				if tokens != nil {
					tok, ok := <-tokens
					if !ok || ctx.Err() != nil { // the end, or the caller stopped the run
						break
					}
					began = tok.start()
					if late.Err() != nil {
						res.unsent = append(res.unsent, time.Since(began))
						continue
					}
				}
				var d Delivery
				dup := false
				if dupWanted {
					d, dup = recent.pick(r)
				}
				if !dup {
					if fresh.ID == "" || time.Since(freshAt) > time.Minute {
						// none made, or made so long ago (a very low rate)
						// that its signature could age out
						fresh = newDelivery()
					}
					d, fresh = fresh, Delivery{}
					recent.add(d) // in flight: a concurrent redelivery may pick it
				}
				sendCtx := finish // without a rate, it finishes after the run's end
				if tokens != nil {
					sendCtx = ctx // at a rate, the client's Timeout bounds it
				}
				status, dedup, lat, err := Send(sendCtx, client, cfg.URL, d)
				if !began.IsZero() {
					lat = time.Since(began)
				}
				if ctx.Err() != nil || tokens == nil && runCtx.Err() != nil {
					break // the run ended (or was stopped) mid-request: not counted
				}
				if err != nil {
					res.status["error"]++
				} else {
					res.status[strconv.Itoa(status)]++
					if dedup == "" {
						dedup = "-"
					}
					res.dedup[dedup]++
				}
				res.lat = append(res.lat, lat)
				if dup {
					res.dupes++
				} else {
					res.newSent++
				}
			}
			results[w] = res
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if tokens == nil && !end.IsZero() {
		elapsed = min(elapsed, end.Sub(start)) // requests let finish after the end are not counted
	}
	var unsent []time.Duration
	if p != nil {
		unsent = p.stop() // the tokens no worker took
	}

	out := Result{ByStatus: map[string]int{}, ByDedup: map[string]int{}, Seconds: elapsed.Seconds(), LatencyFrom: "send"}
	if tokens != nil {
		out.LatencyFrom = "due"
	}
	var all []time.Duration
	for _, r := range results {
		all = append(all, r.lat...)
		unsent = append(unsent, r.unsent...)
		for k, v := range r.status {
			out.ByStatus[k] += v
		}
		for k, v := range r.dedup {
			out.ByDedup[k] += v
		}
		out.NewSent += r.newSent
		out.DupSent += r.dupes
	}
	out.Requests = len(all)
	out.Throughput = float64(out.Requests) / elapsed.Seconds()
	out.Unsent = len(unsent)
	all = append(all, unsent...) // their waits count in the quantiles
	if len(all) > 0 {
		slices.Sort(all)
		q := func(p float64) float64 {
			return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
		}
		out.P50, out.P90, out.P99 = q(0.50), q(0.90), q(0.99)
		out.Max = float64(all[len(all)-1]) / float64(time.Millisecond)
	}
	return out, nil
}

// A token lets one request go at a rate: due is when it falls due, woke
// when the pacer, waiting for that time, woke to hand it out.
type token struct{ due, woke time.Time }

// TimerSlack is the most of a paced generator's lateness in waking
// that is left out of a latency: the granularity of Go's timer on
// Linux, where an idle process sleeps whole milliseconds.
const TimerSlack = time.Millisecond

// PacedStart is when work due at due, whose generator woke (or went on)
// at woke to start it, counts from: when it woke, but at most
// TimerSlack after the due time. So the timer's lateness, which is the
// generator's, is left out; a wake-up later than that (a CPU held by
// the work measured, a GC pause) counts, and so does any wait after
// the due time for what the work measured held up (no coordinated
// omission).
func PacedStart(due, woke time.Time) time.Time {
	if late := due.Add(TimerSlack); woke.After(late) {
		return late
	}
	return woke
}

// start is when a request sent on t counts from: see PacedStart. The
// time the token waited for a free connection counts: a slow answer
// delays the requests due behind it, and they are counted.
func (t token) start() time.Time { return PacedStart(t.due, t.woke) }

// A pacer hands out tokens at a rate (see pace).
type pacer struct {
	ch     chan token
	cancel context.CancelFunc
	done   chan struct{}
	unsent []time.Duration // read once done
}

// pace hands out rate tokens a second, each with its due time, one
// every 1/rate from now, however late they are taken: those due before
// end (zero: until ctx ends), then it closes the channel. If late ends
// while a token waits to be taken, that token and every one due after
// it and before end are recorded as unsent, each with its wait, and the
// channel is closed.
func pace(ctx, late context.Context, rate float64, end time.Time) *pacer {
	ctx, cancel := context.WithCancel(ctx)
	p := &pacer{ch: make(chan token, 1024), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer close(p.ch)
		interval := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		for i := int64(0); ; i++ {
			due := start.Add(time.Duration(i) * interval)
			if !end.IsZero() && !due.Before(end) {
				return
			}
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			select {
			case p.ch <- token{due, time.Now()}:
			case <-ctx.Done():
				return
			case <-late.Done():
				if ctx.Err() != nil {
					return
				}
				now := time.Now()
				for ; due.Before(end); i++ {
					p.unsent = append(p.unsent, now.Sub(due))
					due = start.Add(time.Duration(i+1) * interval)
				}
				return
			}
		}
	}()
	return p
}

// stop ends the pacer (the workers are done) and returns the tokens it
// recorded as unsent.
func (p *pacer) stop() []time.Duration {
	p.cancel()
	<-p.done
	return p.unsent
}

// String renders a result for people.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests     %d in %.1fs: %.0f req/s (new events %d, redeliveries %d)\n", r.Requests, r.Seconds, r.Throughput, r.NewSent, r.DupSent)
	if r.Unsent > 0 {
		fmt.Fprintf(&b, "unsent       %d due before the end, not sent within the timeout after it (their waits are in the latency)\n", r.Unsent)
	}
	from := ""
	if r.LatencyFrom == "due" {
		from = " (each request from its due time)"
	}
	fmt.Fprintf(&b, "latency ms   p50 %.2f  p90 %.2f  p99 %.2f  max %.2f%s\n", r.P50, r.P90, r.P99, r.Max, from)
	fmt.Fprintf(&b, "by status    %s\n", counts(r.ByStatus))
	fmt.Fprintf(&b, "Sangho-Dedup %s\n", counts(r.ByDedup))
	return b.String()
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// JSON renders a result for machines.
func (r Result) JSON() string {
	b, _ := json.MarshalIndent(r, "", "  ")
	return string(b)
}

// SinkHandler is a minimal webhook backend: it reads each request's body
// to the end and answers 200 {"received":true}. sangho-send's sink and
// the benchmark's backend are this handler.
var SinkHandler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(sinkAnswer)
})

var sinkAnswer = []byte(`{"received":true}`)

// NewSink returns a server of SinkHandler on addr.
func NewSink(addr string) *http.Server {
	return &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second, Handler: SinkHandler}
}

// EventID is the ID of a run's i-th event of a kind ("w" warm-up, "n"
// new): evt_, 16 hex digits that look random, then the run, the kind
// and i padded to width digits (a run that pads every i to one width
// gets IDs of one length), unique for each (kind, i) of a run. The
// random-looking head spreads a run's events over the store's keys as
// senders' IDs do (Sangho's and Stripe's are not ordered): IDs ordered
// by i would all land in one narrow range of a store's keys, which a
// store of millions of records finds in a few cached blocks and
// compacts in one corner, and would hide what a claim and its record
// cost there. The head depends on the run too, so that the i-th event
// of the next run (the next round on the same store) does not land
// beside this run's i-th.
func EventID(run, kind string, width, i int) string {
	h := uint64(i) << 1 // i and the kind ("w" or not), one to one
	if kind == "w" {
		h |= 1
	}
	r := fnv.New64a()
	r.Write([]byte(run))
	h ^= r.Sum64()                                // the same for every event of the run: still one to one
	h = h*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019 // splitmix64: a bijection of h
	h = (h ^ h>>30) * 0xBF58476D1CE4E5B9
	h = (h ^ h>>27) * 0x94D049BB133111EB
	h ^= h >> 31
	return fmt.Sprintf("evt_%016x_%s_%s%0*d", h, run, kind, width, i)
}
