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

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
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

// TestCheckUnixTimeCanonical: a Unix timestamp is accepted in its one
// canonical form only: digits, no leading zero, no sign, no space. A
// leading zero is what let the review's replay move a digit from the ID
// into the timestamp.
func TestCheckUnixTimeCanonical(t *testing.T) {
	now := testNow
	ts := strconv.FormatInt(now.Unix(), 10)
	for in, want := range map[string]error{
		ts:                    nil,
		"0" + ts:              errSigMalformed,
		"00" + ts:             errSigMalformed,
		"+" + ts:              errSigMalformed,
		" " + ts:              errSigMalformed,
		ts + " ":              errSigMalformed,
		"":                    errSigMalformed,
		"0":                   errSigTimestamp, // canonical, long ago
		"1" + ts:              errSigTimestamp,
		"9999999999999999999": errSigMalformed, // over int64
	} {
		if err := checkUnixTime(in, now, 5*time.Minute); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
	// Through the hmac scheme, with a template that separates the parts:
	// a timestamp with a leading zero, signed as sent, is still refused.
	body := `{"event_id":"ev_1"}`
	h := schemeHandler(t, `{"scheme":"hmac","header":"X-Sig","timestamp_header":"X-Ts","id_field":"event_id"}`, []string{secret1}, nil)
	for _, sent := range []string{ts, "0" + ts} {
		r := post(body, map[string]string{"X-Sig": hmacHex(sent + "." + body), "X-Ts": sent})
		_, err := h.scheme.Verify(r, []byte(body))
		if want := map[bool]error{true: nil, false: errSigMalformed}[sent == ts]; !errors.Is(err, want) {
			t.Errorf("timestamp %q: %v, want %v", sent, err, want)
		}
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
		h := &Handler{Secrets: []string{secret1}, StoreRaw: json.RawMessage(`{"type":"memory"}`), Tolerance: c.tolerance, RequireBodyID: &off}
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

// TestHMACTemplateSeparation: signed_content is refused where two of
// {id}, {timestamp} and {body} are not kept apart by a character one of
// them cannot hold (an ID: letters, digits, _ and -; a Unix timestamp:
// digits); an RFC 3339 timestamp keeps itself apart. The error names
// signed_content and the two parts.
func TestHMACTemplateSeparation(t *testing.T) {
	for _, c := range []struct {
		format, template, idField string
		refused                   string // the parts named, "" if accepted
	}{
		{"unix", "{id}{timestamp}{body}", "", "{id} and {timestamp}"},
		{"unix", "{id}.{timestamp}{body}", "", "{timestamp} and {body}"},
		{"unix", "{timestamp}{body}", "id", "{timestamp} and {body}"},
		{"unix", "{body}{timestamp}", "id", "{body} and {timestamp}"},
		{"unix", "{id}7{timestamp}.{body}", "", "{id} and {timestamp}"},
		{"unix", "{timestamp}{timestamp}.{body}", "id", "{timestamp} and {timestamp}"},
		{"", "{id}{body}", "", "{id} and {body}"},
		{"", "{body}{id}", "", "{body} and {id}"},
		{"", "{body}-{id}", "", "{body} and {id}"},
		{"", "{id}_a-{body}", "", "{id} and {body}"},
		{"rfc3339", "{id}{body}{timestamp}", "", "{id} and {body}"},

		{"unix", "{id}.{timestamp}.{body}", "", ""},
		{"unix", "{id}-{timestamp}:{body}", "", ""}, // '-' is not a digit, ':' in neither ID nor timestamp
		{"unix", "v0:{timestamp}:{body}", "id", ""},
		{"unix", "{timestamp}.{body}", "id", ""},
		{"", "{body}", "id", ""},
		{"", "{body}|end", "id", ""},
		{"", "{body}.{id}", "", ""},
		{"rfc3339", "{id}{timestamp}{body}", "", ""},
		{"rfc3339", "{timestamp}{body}", "id", ""},
		{"rfc3339", "{body}{timestamp}{id}", "", ""},
	} {
		s := &HMACScheme{Header: "X-Sig", SignedContent: c.template, IDField: c.idField}
		if c.idField == "" {
			s.IDHeader = "X-Id"
		}
		if c.format != "" {
			s.TimestampHeader, s.TimestampFormat = "X-Ts", c.format
		}
		err := s.setup()
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s %q: %v, want accepted", c.format, c.template, err)
		case c.refused != "" && (err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("signed_content %q: %s are not kept apart", c.template, c.refused))):
			t.Errorf("%s %q: %v, want refused for %s", c.format, c.template, err, c.refused)
		}
	}
	for _, c := range []struct{ header, format, want string }{
		{"X-Ts", "iso", `timestamp_format must be unix or rfc3339, not "iso"`},
		{"", "rfc3339", "timestamp_format is set but there is no timestamp_header"},
	} {
		s := &HMACScheme{Header: "X-Sig", IDField: "id", TimestampHeader: c.header, TimestampFormat: c.format}
		if c.header != "" {
			s.SignedContent = "{timestamp}.{body}"
		}
		if err := s.setup(); err == nil || err.Error() != c.want {
			t.Errorf("timestamp_header %q timestamp_format %q: %v, want %s", c.header, c.format, err, c.want)
		}
	}
}

// TestCheckRFC3339Time: the strict RFC 3339 form only, within tolerance.
func TestCheckRFC3339Time(t *testing.T) {
	now := time.Date(2019, 11, 16, 10, 11, 12, 634234626, time.UTC)
	for in, want := range map[string]error{
		"2019-11-16T10:11:12.634234626Z":      nil,
		"2019-11-16T10:11:12Z":                nil,
		"2019-11-16T10:11:12.6Z":              nil,
		"2019-11-16T11:11:12.634234626+01:00": nil,
		"2019-11-16T09:11:12-01:00":           nil,
		"2019-11-16T10:05:12Z":                errSigTimestamp,
		"2019-11-16T10:17:13Z":                errSigTimestamp,
		"02019-11-16T10:11:12Z":               errSigMalformed, // a character moved in from before
		"019-11-16T10:11:12Z":                 errSigMalformed, // or out
		"2019-11-16T10:11:12Z0":               errSigMalformed,
		"2019-11-16T10:11:12":                 errSigMalformed, // no zone
		"2019-11-16t10:11:12z":                errSigMalformed,
		"2019-11-16 10:11:12Z":                errSigMalformed,
		"2019-11-16T10:11:12.Z":               errSigMalformed,
		"2019-11-16T10:11:12.6342346261Z":     errSigMalformed, // 10 fraction digits
		"2019-11-16T10:11:12+0100":            errSigMalformed,
		"2019-11-16T10:11:12+01":              errSigMalformed,
		"2019-13-16T10:11:12Z":                errSigMalformed,
		"2019-11-16T24:11:12Z":                errSigMalformed,
		"1573899072":                          errSigMalformed,
		"":                                    errSigMalformed,
	} {
		if err := checkRFC3339Time(in, now, 5*time.Minute); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
}
