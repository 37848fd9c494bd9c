// Command sangho-send signs and sends Sangho webhook events, for trying
// out and load-testing an endpoint behind sangho_dedup.
//
//	sangho-send event --url URL --secret S [--id ID] [--type T] [--data JSON|@file] [--repeat N]
//	sangho-send sign --secret S [--t UNIX] < body
//	sangho-send load --url URL --secret S --concurrency C (--duration D | --events N)
//	                 [--duplicates RATIO] [--body-size BYTES] [--rate R] [--json]
//	sangho-send sink [--listen 127.0.0.1:3000]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

const usage = `usage:
  sangho-send event --url URL --secret S [--id ID] [--type T] [--data JSON|@file] [--repeat N]
      sign and send one event (N times); print each status and Sangho-Dedup header
  sangho-send sign --secret S [--t UNIX] < body
      print the Sangho-Signature header value for the body on standard input
  sangho-send load --url URL --secret S --concurrency C (--duration D | --events N)
                   [--duplicates RATIO] [--body-size BYTES] [--rate R] [--json]
      signed load with a share of redeliveries; throughput, latency, counts
  sangho-send sink [--listen 127.0.0.1:3000]
      a minimal backend that reads each request and answers 200 {"received":true}

The secret may be given as --secret or in SANGHO_WEBHOOK_SECRET.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "event":
		err = cmdEvent(os.Args[2:])
	case "sign":
		err = cmdSign(os.Args[2:])
	case "load":
		err = cmdLoad(os.Args[2:])
	case "sink":
		err = cmdSink(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sangho-send:", err)
		os.Exit(1)
	}
}

// secretFlag is --secret. Its default, $SANGHO_WEBHOOK_SECRET, is read
// after the flags (needSecret), not given to the flag package, which
// prints a flag's default in its usage text (-h, a bad flag).
func secretFlag(fs *flag.FlagSet) *string {
	return fs.String("secret", "", "signing secret (default $SANGHO_WEBHOOK_SECRET)")
}

// needSecret fills s from $SANGHO_WEBHOOK_SECRET if --secret was not
// given, and refuses no secret at all.
func needSecret(s *string) error {
	if *s == "" {
		*s = os.Getenv("SANGHO_WEBHOOK_SECRET")
	}
	if *s == "" {
		return fmt.Errorf("no secret: give --secret or set SANGHO_WEBHOOK_SECRET")
	}
	return nil
}

func cmdEvent(args []string) error {
	fs := flag.NewFlagSet("event", flag.ExitOnError)
	url := fs.String("url", "http://localhost:8080/", "endpoint URL")
	secret := secretFlag(fs)
	id := fs.String("id", "", "event ID (default: a new evt_... ID)")
	typ := fs.String("type", "payment_intent.succeeded", "event type")
	data := fs.String("data", `{"object":{"id":"pi_1","amount":2000,"currency":"eur"}}`, "the event's data object as JSON, or @file")
	repeat := fs.Int("repeat", 1, "send the same event this many times (fresh signature each time)")
	_ = fs.Parse(args)
	if err := needSecret(secret); err != nil {
		return err
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat must be 1 or more, not %d", *repeat)
	}
	if *id == "" {
		*id = "evt_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	raw := []byte(*data)
	if strings.HasPrefix(*data, "@") {
		var err error
		if raw, err = os.ReadFile((*data)[1:]); err != nil {
			return err
		}
	}
	if !json.Valid(raw) {
		return fmt.Errorf("--data is not valid JSON")
	}
	body, _ := json.Marshal(struct {
		ID      string          `json:"id"`
		Object  string          `json:"object"`
		Type    string          `json:"type"`
		Created int64           `json:"created"`
		Data    json.RawMessage `json:"data"`
	}{*id, "event", *typ, time.Now().Unix(), raw})
	client := load.Client(1, 30*time.Second)
	answered := 0
	for i := 1; i <= *repeat; i++ {
		d := load.NewDelivery(*id, body, *secret)
		status, dedup, lat, err := load.Send(context.Background(), client, *url, d)
		if err != nil {
			fmt.Printf("%d  %s  error: %v\n", i, *id, err)
			continue
		}
		answered++
		if dedup == "" {
			dedup = "-"
		}
		fmt.Printf("%d  %s  %d  Sangho-Dedup: %s  (%.1f ms)\n", i, *id, status, dedup, float64(lat)/float64(time.Millisecond))
	}
	if answered == 0 {
		return errNoAnswer
	}
	return nil
}

// errNoAnswer ends a run in which no delivery got an HTTP answer (the
// endpoint down, a wrong URL): exit 1.
var errNoAnswer = errors.New("no delivery was answered")

func cmdSign(args []string) error {
	fs := flag.NewFlagSet("sign", flag.ExitOnError)
	secret := secretFlag(fs)
	t := fs.Int64("t", 0, "Unix time to sign at (default: now)")
	_ = fs.Parse(args)
	if err := needSecret(secret); err != nil {
		return err
	}
	body, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	at := time.Now()
	if *t != 0 {
		at = time.Unix(*t, 0)
	}
	fmt.Println(sangho.Sign(at, body, *secret))
	return nil
}

func cmdLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	var cfg load.Config
	fs.StringVar(&cfg.URL, "url", "http://localhost:8080/", "endpoint URL")
	secret := secretFlag(fs)
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "parallel connections")
	fs.DurationVar(&cfg.Duration, "duration", 0, "run this long (e.g. 10s)")
	fs.IntVar(&cfg.Events, "events", 0, "or send this many requests")
	fs.Float64Var(&cfg.Duplicates, "duplicates", 0, "share of requests that redeliver a recent event, in flight or done (0..1)")
	fs.IntVar(&cfg.BodySize, "body-size", 1024, "approximate body size in bytes")
	fs.Float64Var(&cfg.Rate, "rate", 0, "requests per second in all, each one's latency counted from its due time (default: as fast as possible)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	_ = fs.Parse(args)
	if err := needSecret(secret); err != nil {
		return err
	}
	cfg.Secret = *secret
	switch {
	case cfg.Duplicates < 0 || cfg.Duplicates > 1:
		return fmt.Errorf("--duplicates must be between 0 and 1")
	case cfg.Duration < 0:
		return fmt.Errorf("--duration must not be negative, not %v", cfg.Duration)
	case cfg.Events < 0:
		return fmt.Errorf("--events must not be negative, not %d", cfg.Events)
	case cfg.Concurrency < 1:
		return fmt.Errorf("--concurrency must be 1 or more, not %d", cfg.Concurrency)
	case cfg.Rate < 0:
		return fmt.Errorf("--rate must not be negative, not %v", cfg.Rate)
	case cfg.BodySize < 0:
		return fmt.Errorf("--body-size must not be negative, not %d", cfg.BodySize)
	}
	if cfg.Duration == 0 && cfg.Events == 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Duplicates > 0 {
		cfg.Warmup = min(100, max(1, cfg.Concurrency))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := load.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		fmt.Println(res.JSON())
	} else {
		fmt.Print(res.String())
	}
	if res.Requests > 0 && res.ByStatus["error"] == res.Requests {
		return errNoAnswer
	}
	return nil
}

func cmdSink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:3000", "address to listen on")
	_ = fs.Parse(args)
	srv := load.NewSink(*listen)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sink listening on %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
