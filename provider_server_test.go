package sanghodedup

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
)

// Per provider, through a real Caddy (in this process) in front of
// reverse_proxy and a ledger backend: a delivery signed as the provider
// signs (with its own library where it has one) is processed once; the
// same delivery again is a duplicate; rotation works; a wrong secret, a
// stale timestamp, a tampered body, a missing header get the documented
// answer; where the ID is not signed, a replay under another ID gets 401.

type providerCase struct {
	name      string
	lines     string    // the provider's lines inside sangho_dedup
	secrets   [2]string // configured together: a rotation on this side
	wrong     string    // a secret of the right form that is not configured
	body      func(id string) string
	sign      func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string)
	timestamp bool   // the scheme signs a timestamp
	sigHeader string // the signature header
	idHeader  string // the event ID header, "" when the ID is in the body
	idSigned  bool   // the signature covers idHeader
	rolls     bool   // the sender sends one signature per secret while rolling
	id        func(n int) string
}

var providerCases = []providerCase{
	{
		name: "stripe", lines: "provider stripe",
		secrets: [2]string{stripeSecret, "whsec_stripe_test_2"}, wrong: "whsec_stripe_wrong",
		body: eventBody,
		sign: func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string) {
			r.Header.Set("Stripe-Signature", stripeHeader(at, body, secrets...))
		},
		timestamp: true, sigHeader: "Stripe-Signature", rolls: true,
		id: func(n int) string { return "evt_stripe_" + strconv.Itoa(n) },
	},
	{
		name: "standard_webhooks", lines: "provider standard_webhooks",
		secrets: [2]string{swSecret1, swSecret2}, wrong: "whsec_" + base64.StdEncoding.EncodeToString([]byte("not the configured secret")),
		body: func(id string) string {
			return `{"type":"user.created","timestamp":"2026-01-01T00:00:00Z","data":{"user":"` + id + `"}}`
		},
		sign: func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string) {
			swSign(t, r.Header, id, at, body, secrets...)
		},
		timestamp: true, sigHeader: "Webhook-Signature", idHeader: "Webhook-Id", idSigned: true, rolls: true,
		id: func(n int) string { return "msg_2KWPBgLlAfxdpx2AI54pPJ8" + strconv.Itoa(n) },
	},
	{
		name: "github", lines: "provider github",
		secrets: [2]string{ghSecret1, ghSecret2}, wrong: "not the configured secret",
		body: func(id string) string { return `{"action":"opened","issue":{"number":1,"title":"` + id + `"}}` },
		sign: func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string) {
			r.Header.Set("X-Hub-Signature-256", githubSig(body, secrets[0]))
			r.Header.Set("X-GitHub-Delivery", id)
			r.Header.Set("X-GitHub-Event", "issues")
		},
		sigHeader: "X-Hub-Signature-256", idHeader: "X-Github-Delivery",
		id: func(n int) string { return fmt.Sprintf("72d3162e-cc78-11e3-81ab-4c9367dc%04d", n) },
	},
	{
		name: "shopify", lines: "provider shopify",
		secrets: [2]string{shopSecret1, shopSecret2}, wrong: "not the configured secret",
		body: func(id string) string { return `{"id":820982911946154508,"note":"` + id + `"}` },
		sign: func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string) {
			r.Header.Set("X-Shopify-Hmac-Sha256", shopifySig(body, secrets[0]))
			r.Header.Set("X-Shopify-Event-Id", id)
			r.Header.Set("X-Shopify-Topic", "orders/create")
		},
		sigHeader: "X-Shopify-Hmac-Sha256", idHeader: "X-Shopify-Event-Id",
		id: func(n int) string { return fmt.Sprintf("98880550-7158-44d4-b7cd-2c97c8a0%04d", n) },
	},
	{
		name: "hmac", lines: "provider hmac {\n\t\t\theader X-Signature\n\t\t\tprefix v0=\n\t\t\ttimestamp_header X-Timestamp\n\t\t\tsigned_content v0:{timestamp}:{body}\n\t\t\tid_field event_id\n\t\t}",
		secrets: [2]string{"hmac_secret_1", "hmac_secret_2"}, wrong: "not the configured secret",
		body: func(id string) string { return `{"event_id":"` + id + `","type":"thing.done"}` },
		sign: func(t *testing.T, r *http.Request, body, id string, at time.Time, secrets ...string) {
			ts := strconv.FormatInt(at.Unix(), 10)
			r.Header.Set("X-Timestamp", ts)
			r.Header.Set("X-Signature", "v0="+hmacWith(secrets[0], "v0:"+ts+":"+body))
		},
		timestamp: true, sigHeader: "X-Signature",
		id: func(n int) string { return "ev_hmac_" + strconv.Itoa(n) },
	},
}

func hmacWith(secret, content string) string {
	return strings.TrimPrefix(githubSig(content, secret), "sha256=")
}

// providerSite is a site with sangho_dedup for provider p in front of
// reverse_proxy to the ledger, which learns the event ID from the
// {http.sangho_dedup.event_id} placeholder.
func providerSite(p providerCase, backend, options string) string {
	return fmt.Sprintf(`	sangho_dedup {
		%s
		secret %q %q
		%s
	}
	reverse_proxy %s {
		header_up Sangho-Event-ID {http.sangho_dedup.event_id}
	}`, p.lines, p.secrets[0], p.secrets[1], options, backend)
}

// delivery builds a request to url for event id of provider p.
func (p providerCase) delivery(t *testing.T, url, id string, at time.Time, secrets ...string) *http.Request {
	t.Helper()
	body := p.body(id)
	r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	p.sign(t, r, body, id, at, secrets...)
	return r
}

// resend is the same request again (same body bytes, same headers), with
// edit applied to a copy of the headers and body.
func resend(t *testing.T, r *http.Request, edit func(h http.Header, body []byte) []byte) *http.Request {
	t.Helper()
	var body []byte
	if r.GetBody != nil {
		rc, _ := r.GetBody()
		body, _ = io.ReadAll(rc)
	}
	h := r.Header.Clone()
	if edit != nil {
		body = edit(h, bytes.Clone(body))
	}
	c, _ := http.NewRequest(http.MethodPost, r.URL.String(), bytes.NewReader(body))
	c.Header = h
	return c
}

func TestServerProviders(t *testing.T) {
	for _, p := range providerCases {
		t.Run(p.name, func(t *testing.T) {
			l := ledger.New(t)
			s := startCaddy(t, providerSite(p, l.Addr, "key_prefix "+p.name+":"))
			now := time.Now()
			check := func(step string, r *http.Request, status int, dedup string) {
				t.Helper()
				a := do(t, r)
				if a.status != status || a.dedup != dedup {
					t.Errorf("%s: %d %q (%s), want %d %q", step, a.status, a.dedup, a.body, status, dedup)
				}
			}
			first := p.delivery(t, s.url, p.id(1), now, p.secrets[0])
			check("a new delivery", first, 200, "")
			check("the same delivery again", resend(t, first, nil), 200, "duplicate")
			check("signed with the second configured secret", p.delivery(t, s.url, p.id(2), now, p.secrets[1]), 200, "")
			if p.rolls {
				check("signed with an unknown secret and a configured one", p.delivery(t, s.url, p.id(3), now, p.wrong, p.secrets[1]), 200, "")
			}
			check("a wrong secret", p.delivery(t, s.url, p.id(4), now, p.wrong), 401, "")
			if p.timestamp {
				check("a stale timestamp", p.delivery(t, s.url, p.id(5), now.Add(-6*time.Minute), p.secrets[0]), 401, "")
				check("a timestamp from the future", p.delivery(t, s.url, p.id(5), now.Add(6*time.Minute), p.secrets[0]), 401, "")
			}
			check("a tampered body", resend(t, p.delivery(t, s.url, p.id(6), now, p.secrets[0]), func(_ http.Header, b []byte) []byte {
				return bytes.Replace(b, []byte(p.id(6)), []byte(p.id(7)), 1)
			}), 401, "")
			check("no signature header", resend(t, p.delivery(t, s.url, p.id(8), now, p.secrets[0]), func(h http.Header, b []byte) []byte {
				h.Del(p.sigHeader)
				return b
			}), 401, "")
			if p.idHeader != "" {
				want := 400 // no event ID
				if p.idSigned {
					want = 401 // part of what is signed
				}
				check("no event ID header", resend(t, p.delivery(t, s.url, p.id(9), now, p.secrets[0]), func(h http.Header, b []byte) []byte {
					h.Del(p.idHeader)
					return b
				}), want, "")
			}
			if p.idHeader != "" && !p.idSigned {
				check("the first delivery replayed under another ID", resend(t, first, func(h http.Header, b []byte) []byte {
					h.Set(p.idHeader, p.id(10))
					return b
				}), 401, "")
			}
			for n := 1; n <= 10; n++ {
				want := 0
				if n == 1 || n == 2 || n == 3 && p.rolls {
					want = 1
				}
				if got, ok := l.Counts(p.id(n)); got != want || ok != want {
					t.Errorf("%s reached the backend %d times (%d 2xx), want %d", p.id(n), got, ok, want)
				}
			}
		})
	}
}

// TestServerUnsignedIDReplayOnEachStore: the record that binds a GitHub
// or Shopify delivery to its ID lives in the store, so the replay is
// refused on each store (and across instances sharing Redis).
func TestServerUnsignedIDReplayOnEachStore(t *testing.T) {
	for _, p := range providerCases {
		if p.name != "github" && p.name != "shopify" {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, store string) {
				l := ledger.New(t)
				s := startCaddy(t, providerSite(p, l.Addr, store))
				first := p.delivery(t, s.url, p.id(1), time.Now(), p.secrets[0])
				for i, want := range []int{200, 401, 401, 200} {
					r := resend(t, first, nil)
					if i == 1 || i == 2 {
						r.Header.Set(p.idHeader, p.id(10+i))
					}
					if a := do(t, r); a.status != want {
						t.Errorf("delivery %d: %d, want %d", i+1, a.status, want)
					}
				}
				reached := len(l.Received())
				if reached != 1 {
					t.Errorf("%d event IDs reached the backend, want 1", reached)
				}
			})
		})
	}
}

// TestServerGitHubRedeliveryAfterForget: GitHub's manual redelivery
// reuses the delivery ID and the body; once an operator forgets the
// event, that redelivery is processed again (the replay record of the
// same ID does not refuse it), while a replay under another ID still is.
func TestServerGitHubRedeliveryAfterForget(t *testing.T) {
	var gh providerCase
	for _, p := range providerCases {
		if p.name == "github" {
			gh = p
		}
	}
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		s := startAdminCaddy(t, providerSite(gh, l.Addr, store+"\n\t\tname gh"))
		first := gh.delivery(t, s.url, gh.id(7), time.Now(), gh.secrets[0])
		if a := do(t, resend(t, first, nil)); a.status != 200 || a.dedup != "" {
			t.Fatalf("first delivery: %d %q", a.status, a.dedup)
		}
		if a := do(t, resend(t, first, nil)); a.dedup != "duplicate" {
			t.Fatalf("redelivery before forget: %d %q, want a duplicate", a.status, a.dedup)
		}
		if status, v := s.api(t, http.MethodDelete, "/sangho_dedup/gh/events/"+gh.id(7)); status != 200 {
			t.Fatalf("forget: %d %v", status, v)
		}
		if a := do(t, resend(t, first, nil)); a.status != 200 || a.dedup != "" {
			t.Fatalf("redelivery after forget: %d %q, want processed", a.status, a.dedup)
		}
		if n, _ := l.Counts(gh.id(7)); n != 2 {
			t.Fatalf("the backend got the delivery %d times, want 2 (once more after forget)", n)
		}
		replay := resend(t, first, nil)
		replay.Header.Set(gh.idHeader, gh.id(8))
		if a := do(t, replay); a.status != 401 {
			t.Fatalf("a replay under another ID after forget: %d, want 401", a.status)
		}
	})
}
