package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

// tryCaddy adapts and loads a site like startCaddy, but returns the
// error of a config that is refused instead of failing the test.
func tryCaddy(t *testing.T, site string) (*caddyServer, error) {
	t.Helper()
	ownDataDir(t)
	port := freePort(t)
	s := &caddyServer{url: "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook", port: port}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(serverCaddyfile(port, site)), nil)
	if err == nil {
		err = caddy.Load(cfg, true)
	}
	if err == nil {
		t.Cleanup(func() { _ = caddy.Stop() })
	}
	return s, err
}

// TestServerHMACIDTimestampShift: the review's replay. With
// signed_content "{id}{timestamp}{body}" and Unix timestamps, nothing
// separates the ID from the timestamp, so moving a trailing 0 of the ID
// to the front of the timestamp keeps the signed bytes, and with them the
// signature: msg_100/1733140800, msg_10/01733140800 and
// msg_1/001733140800 were three new events. Such a template is refused
// at load, naming signed_content; with an RFC 3339 timestamp (Twitch's),
// whose form shows where it starts, the same three deliveries reach the
// backend once.
func TestServerHMACIDTimestampShift(t *testing.T) {
	const secret = "hmac_shift_secret"
	body := `{"subscription":{"type":"channel.follow"},"event":{"user_id":"1337"}}`
	for _, c := range []struct {
		name, format string
		ts           func(time.Time) string
		refused      bool
	}{
		{"unix", "", func(at time.Time) string { return strconv.FormatInt(at.Unix(), 10) }, true},
		{"rfc3339", "\n\t\t\ttimestamp_format rfc3339", func(at time.Time) string { return at.UTC().Format("2006-01-02T15:04:05.000000000Z07:00") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := ledger.New(t)
			s, err := tryCaddy(t, fmt.Sprintf(`	sangho_dedup {
		provider hmac {
			header X-Sig
			prefix sha256=
			timestamp_header X-Ts%s
			signed_content "{id}{timestamp}{body}"
			id_header X-Msg-Id
		}
		secret %q
	}
	reverse_proxy %s {
		header_up Sangho-Event-ID {http.sangho_dedup.event_id}
	}`, c.format, secret, l.Addr))
			if c.refused {
				if err == nil || !strings.Contains(err.Error(), "signed_content") || !strings.Contains(err.Error(), "{id} and {timestamp}") {
					t.Errorf("loading: %v, want the config refused with an error naming signed_content and the parts that touch", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("loading config: %v", err)
			}
			ts := c.ts(time.Now())
			sig := "sha256=" + hmacWith(secret, "msg_100"+ts+body)
			for i, d := range []struct{ id, ts string }{{"msg_100", ts}, {"msg_10", "0" + ts}, {"msg_1", "00" + ts}} {
				r, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
				r.Header.Set("X-Msg-Id", d.id)
				r.Header.Set("X-Ts", d.ts)
				r.Header.Set("X-Sig", sig)
				a := do(t, r)
				if want := map[bool]int{true: 200, false: 401}[i == 0]; a.status != want {
					t.Errorf("id %s ts %s: %d (%s), want %d", d.id, d.ts, a.status, a.body, want)
				}
			}
			if got, _ := l.Totals(); got != 1 {
				t.Errorf("the backend got %d deliveries of one signed message, want 1", got)
			}
		})
	}
}

// TestToleranceBounded: a tolerance above MaxTolerance is a config error
// naming tolerance. Before, 2×tolerance+1s (how long a signed message is
// bound to its ID) overflowed past ~53,375 days and went negative, which
// switched the replay binding off without a word; that sum now
// saturates, and the largest tolerance allowed binds for 2×it+1s.
func TestToleranceBounded(t *testing.T) {
	off := false
	huge := caddy.Duration(60000 * 24 * time.Hour)
	for _, c := range []struct {
		tolerance caddy.Duration
		ok        bool
	}{
		{caddy.Duration(MaxTolerance), true},
		{caddy.Duration(MaxTolerance + time.Nanosecond), false},
		{huge, false},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		// A retention of twice the tolerance: a shorter one is refused
		// (TestRetentionCoversTheSignatureWindow).
		h := &Handler{Secrets: []string{secret1}, StoreRaw: json.RawMessage(`{"type":"memory"}`), Tolerance: c.tolerance, RequireBodyID: &off,
			Retention: caddy.Duration(2 * MaxTolerance)}
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		cancel()
		if h.sigMemory <= 0 {
			t.Errorf("tolerance %v: the signed message is bound to its ID for %v", time.Duration(c.tolerance), h.sigMemory)
		}
		if c.ok {
			if err != nil || h.sigMemory != 2*MaxTolerance+time.Second {
				t.Errorf("tolerance %v: %v, bound for %v; want accepted, bound for %v", time.Duration(c.tolerance), err, h.sigMemory, 2*MaxTolerance+time.Second)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), "tolerance: ") {
			t.Errorf("tolerance %v: %v, want a config error naming tolerance", time.Duration(c.tolerance), err)
		}
	}
}

// TestHMACRefusesNonCanonicalTimestamp: through the hmac provider, with a
// template that separates the parts, a timestamp with a leading zero,
// signed as sent, is still refused.
func TestHMACRefusesNonCanonicalTimestamp(t *testing.T) {
	ts := strconv.FormatInt(testNow.Unix(), 10)
	body := `{"event_id":"ev_1"}`
	h := providerHandler(t, `{"name":"hmac","header":"X-Sig","timestamp_header":"X-Ts","id_field":"event_id"}`, []string{secret1}, nil)
	for _, sent := range []string{ts, "0" + ts} {
		r := post(body, map[string]string{"X-Sig": hmacHex(sent + "." + body), "X-Ts": sent})
		_, err := h.provider.Verify(r, []byte(body))
		if want := map[bool]error{true: nil, false: dedup.ErrSignatureMalformed}[sent == ts]; !errors.Is(err, want) {
			t.Errorf("timestamp %q: %v, want %v", sent, err, want)
		}
	}
}
