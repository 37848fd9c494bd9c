package providers

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/google/go-github/v84/github"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/senders"
)

// Each provider against its sender: signatures made with the sender's
// own library (Stripe's, Standard Webhooks') or checked with it
// (GitHub's), the vectors the senders document, and what a provider
// refuses. The handler's side (its options over the providers' defaults,
// the event ID, the answers) is tested in the root package.

const (
	swSecret1    = senders.SWSecret1
	swSecret2    = senders.SWSecret2
	ghSecret1    = senders.GHSecret1
	ghSecret2    = senders.GHSecret2
	shopSecret1  = senders.ShopSecret1
	stripeSecret = senders.StripeSecret
)

var (
	stripeHeader = senders.StripeHeader
	swSign       = senders.StandardWebhooks
	githubSig    = senders.GitHub
	shopifySig   = senders.Shopify
)

// testNow is the clock of the provider tests: the time of the contract's
// vectors.
var testNow = time.Unix(1733140800, 0)

// newProvider sets up the provider that config (its JSON, as in the
// handler's "provider") names, the way the handler does at provision:
// the module decoded strictly, its own provisioning, then Init with its
// defaults as the effective settings (canonical header names), secrets
// and a clock that reads now. SignedContent is asked for where the ID is
// not signed, as the handler does.
func newProvider(t testing.TB, config string, secrets []string, now time.Time) dedup.Provider {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(config), &fields); err != nil {
		t.Fatal(err)
	}
	var name string
	if err := json.Unmarshal(fields["name"], &name); err != nil {
		t.Fatalf("provider %s: no name: %v", config, err)
	}
	delete(fields, "name")
	info, err := caddy.GetModule("http.sangho_dedup.providers." + name)
	if err != nil {
		t.Fatal(err)
	}
	mod := info.New()
	rest, _ := json.Marshal(fields)
	dec := json.NewDecoder(strings.NewReader(string(rest)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(mod); err != nil {
		t.Fatalf("provider %s: %v", config, err)
	}
	if p, ok := mod.(caddy.Provisioner); ok {
		if err := p.Provision(caddy.Context{}); err != nil {
			t.Fatalf("provider %s: %v", config, err)
		}
	}
	p := mod.(dedup.Provider)
	d := p.Defaults()
	var idHeaders []string
	for _, h := range d.EventIDHeaders {
		idHeaders = append(idHeaders, http.CanonicalHeaderKey(h))
	}
	if err := p.Init(dedup.ProviderConfig{
		Secrets:         secrets,
		SignatureHeader: http.CanonicalHeaderKey(d.SignatureHeader),
		EventIDHeaders:  idHeaders,
		Tolerance:       d.Tolerance,
		SignedContent:   d.IDSource == dedup.IDFromHeader,
		Now:             func() time.Time { return now },
	}); err != nil {
		t.Fatalf("provider %s: %v", config, err)
	}
	return p
}

// post is a delivery of body with headers.
func post(body string, headers map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

// TestProviderVectors: each provider accepts the signatures of its
// provider's library or documented example, and refuses them with one
// byte of the body changed or another secret.
func TestProviderVectors(t *testing.T) {
	// GitHub's documented example (docs.github.com, "Validating webhook
	// deliveries"), which go-github's ValidateSignature accepts too.
	const ghDocSig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if err := github.ValidateSignature(ghDocSig, []byte("Hello, World!"), []byte(ghSecret1)); err != nil {
		t.Fatalf("go-github refuses GitHub's documented example: %v", err)
	}
	if got := githubSig("Hello, World!", ghSecret1); got != ghDocSig {
		t.Fatalf("githubSig = %s, GitHub documents %s", got, ghDocSig)
	}
	// Shopify's own library (shopify-api-js, lib/webhooks/__tests__/
	// validate.test.ts): secret test_secret_key, body {"foo": "bar"}.
	const shopBody, shopDocSig = `{"foo": "bar"}`, "B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g="
	if got := shopifySig(shopBody, shopSecret1); got != shopDocSig {
		t.Fatalf("shopifySig = %s, Shopify's library expects %s", got, shopDocSig)
	}
	// The Standard Webhooks library signs its own test message so (the
	// same value as Svix's documentation example).
	swLibAt := time.Unix(1614265330, 0)
	swh := http.Header{}
	swSign(t, swh, "msg_p5jXN8AQM9LWM0D4loKWxJek", swLibAt, `{"test": 2432232314}`, swSecret1)
	if got := swh.Get("webhook-signature"); got != "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" {
		t.Fatalf("the Standard Webhooks library signs %s", got)
	}

	type vector struct {
		name     string
		provider string
		secret   string
		at       time.Time
		body     string
		headers  map[string]string
		wantID   string // the signed ID (standard_webhooks)
	}
	stripeAt := testNow.Add(-time.Minute)
	vectors := []vector{
		{"stripe library", `{"name":"stripe"}`, stripeSecret, testNow, bodyA,
			map[string]string{"Stripe-Signature": stripeHeader(stripeAt, bodyA, stripeSecret)}, ""},
		{"stripe library, rolled secret (two v1)", `{"name":"stripe"}`, stripeSecret, testNow, bodyA,
			map[string]string{"Stripe-Signature": stripeHeader(stripeAt, bodyA, "whsec_old", stripeSecret)}, ""},
		{"standard webhooks library", `{"name":"standard_webhooks"}`, swSecret1, swLibAt, `{"test": 2432232314}`,
			map[string]string{"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
				"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}, "msg_p5jXN8AQM9LWM0D4loKWxJek"},
		{"svix header names", `{"name":"standard_webhooks"}`, swSecret1, swLibAt, `{"test": 2432232314}`,
			map[string]string{"svix-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "svix-timestamp": "1614265330",
				"svix-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}, "msg_p5jXN8AQM9LWM0D4loKWxJek"},
		{"standard webhooks, unknown versions and other signatures ignored", `{"name":"standard_webhooks"}`, swSecret1, swLibAt, `{"test": 2432232314}`,
			map[string]string{"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
				"webhook-signature": "v2,abc v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}, "msg_p5jXN8AQM9LWM0D4loKWxJek"},
		{"github documented example", `{"name":"github"}`, ghSecret1, testNow, "Hello, World!",
			map[string]string{"X-Hub-Signature-256": ghDocSig}, ""},
		{"shopify library", `{"name":"shopify"}`, shopSecret1, testNow, shopBody,
			map[string]string{"X-Shopify-Hmac-Sha256": shopDocSig}, ""},
		{"hmac as github", `{"name":"hmac","header":"X-Hub-Signature-256","prefix":"sha256=","id_header":"X-GitHub-Delivery"}`, ghSecret1, testNow, "Hello, World!",
			map[string]string{"X-Hub-Signature-256": ghDocSig}, ""},
		{"hmac as shopify", `{"name":"hmac","header":"X-Shopify-Hmac-Sha256","encoding":"base64","id_header":"X-Shopify-Event-Id"}`, shopSecret1, testNow, shopBody,
			map[string]string{"X-Shopify-Hmac-Sha256": shopDocSig}, ""},
	}
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			p := newProvider(t, v.provider, []string{v.secret}, v.at)
			vd, err := p.Verify(post(v.body, v.headers), []byte(v.body))
			if err != nil || vd.ID != v.wantID {
				t.Fatalf("Verify: %q, %v; want %q, nil", vd.ID, err, v.wantID)
			}
			if _, err := p.Verify(post(v.body+" ", v.headers), []byte(v.body+" ")); !errors.Is(err, dedup.ErrSignatureMismatch) {
				t.Errorf("a body with one more byte: %v, want a mismatch", err)
			}
			otherSecret := v.secret + "x"
			if v.secret == swSecret1 {
				otherSecret = swSecret2
			}
			other := newProvider(t, v.provider, []string{otherSecret}, v.at)
			if _, err := other.Verify(post(v.body, v.headers), []byte(v.body)); !errors.Is(err, dedup.ErrSignatureMismatch) {
				t.Errorf("another secret: %v, want a mismatch", err)
			}
		})
	}
}

// TestGitHubLibraryAgrees: go-github's ValidateSignature accepts the
// github provider's signatures, and the hmac provider's sha1 and sha512 ones
// in GitHub's format (X-Hub-Signature's sha1= is what some senders still
// use).
func TestGitHubLibraryAgrees(t *testing.T) {
	for _, c := range []struct{ provider, header string }{
		{`{"name":"github"}`, "X-Hub-Signature-256"},
		{`{"name":"hmac","header":"X-Hub-Signature","algorithm":"sha1","prefix":"sha1=","id_header":"X-GitHub-Delivery"}`, "X-Hub-Signature"},
		{`{"name":"hmac","header":"X-Sig","algorithm":"sha512","prefix":"sha512=","id_header":"X-GitHub-Delivery"}`, "X-Sig"},
	} {
		p := newProvider(t, c.provider, []string{ghSecret2}, testNow)
		for i, body := range []string{"", "{}", bodyA, bodyB, strings.Repeat("x", 70000)} {
			// A signature the library accepts is one the provider accepts,
			// and the other way round: try the right one and a wrong one.
			alg := map[string]string{"X-Hub-Signature-256": "sha256", "X-Hub-Signature": "sha1", "X-Sig": "sha512"}[c.header]
			right := libSignature(t, alg, body, ghSecret2)
			wrong := libSignature(t, alg, body, ghSecret1)
			for _, sig := range []string{right, wrong} {
				libErr := github.ValidateSignature(sig, []byte(body), []byte(ghSecret2))
				_, err := p.Verify(post(body, map[string]string{c.header: sig}), []byte(body))
				if (libErr == nil) != (err == nil) {
					t.Errorf("%s body %d: go-github says %v, the provider %v", c.header, i, libErr, err)
				}
			}
		}
	}
}

// libSignature is a GitHub-format signature (alg=hex) with the hash
// GitHub's library names by alg.
func libSignature(t *testing.T, alg, body, secret string) string {
	t.Helper()
	newHash := map[string]func() hash.Hash{"sha1": sha1.New, "sha256": sha256.New, "sha512": sha512.New}[alg]
	if newHash == nil {
		t.Fatalf("no hash %q", alg)
	}
	mac := hmac.New(newHash, []byte(secret))
	mac.Write([]byte(body))
	return alg + "=" + hex.EncodeToString(mac.Sum(nil))
}

// TestStandardWebhooksEd25519: v1a signatures are Ed25519 signatures of
// `<id>.<timestamp>.<body>` checked with a whpk_ public key; a wrong key,
// a v1a signature of other content, or a whpk_ key for a v1 signature do
// not match.
func TestStandardWebhooksEd25519(t *testing.T) {
	priv := ed25519.NewKeyFromSeed([]byte("sangho_dedup v1a test seed, 32 b"))
	pub := "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	other := ed25519.NewKeyFromSeed([]byte("another seed, another key, 32 by"))
	otherPub := "whpk_" + base64.StdEncoding.EncodeToString(other.Public().(ed25519.PublicKey))
	id, ts, body := "msg_v1a_1", strconv.FormatInt(testNow.Unix(), 10), `{"type":"user.created"}`
	sig := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(id+"."+ts+"."+body)))
	hdr := map[string]string{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig}
	for _, c := range []struct {
		name    string
		secrets []string
		headers map[string]string
		body    string
		ok      bool
	}{
		{"public key", []string{pub}, hdr, body, true},
		{"public key among HMAC secrets", []string{swSecret1, otherPub, pub}, hdr, body, true},
		{"another public key", []string{otherPub}, hdr, body, false},
		{"only an HMAC secret", []string{swSecret1}, hdr, body, false},
		{"other body", []string{pub}, hdr, body + " ", false},
		{"other id", []string{pub}, map[string]string{"webhook-id": "msg_v1a_2", "webhook-timestamp": ts, "webhook-signature": sig}, body, false},
	} {
		p := newProvider(t, `{"name":"standard_webhooks"}`, c.secrets, testNow)
		_, err := p.Verify(post(c.body, c.headers), []byte(c.body))
		if c.ok != (err == nil) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestHMACProviderTemplates: the generic provider's signed content,
// encodings, prefixes and timestamps, against HMACs computed here from
// the sender's documented recipe.
func TestHMACProviderTemplates(t *testing.T) {
	ts := strconv.FormatInt(testNow.Unix(), 10)
	stale := strconv.FormatInt(testNow.Add(-6*time.Minute).Unix(), 10)
	body := `{"event_id":"ev_42","type":"thing.done"}`
	mac := func(content string) []byte {
		m := hmac.New(sha256.New, []byte(secret1))
		m.Write([]byte(content))
		return m.Sum(nil)
	}
	hx := func(content string) string { return hex.EncodeToString(mac(content)) }
	// RFC 3339 as Twitch writes it (nanoseconds), with an offset, stale.
	const twitchLike = `{"name":"hmac","header":"X-Sig","prefix":"sha256=","timestamp_header":"X-Ts","timestamp_format":"rfc3339","signed_content":"{id}{timestamp}{body}","id_header":"X-Msg-Id"}`
	rfc := testNow.UTC().Format("2006-01-02T15:04:05.000000000Z07:00")
	rfcOffset := testNow.In(time.FixedZone("", 2*3600)).Format(time.RFC3339)
	rfcStale := testNow.Add(-6 * time.Minute).UTC().Format(time.RFC3339Nano)
	for _, c := range []struct {
		name     string
		provider string
		headers  map[string]string
		err      error
		id       string // the signed ID, for {id}
	}{
		{"slack-like", `{"name":"hmac","header":"X-Slack-Signature","prefix":"v0=","timestamp_header":"X-Slack-Request-Timestamp","signed_content":"v0:{timestamp}:{body}","id_field":"event_id"}`,
			map[string]string{"X-Slack-Signature": "v0=" + hx("v0:"+ts+":"+body), "X-Slack-Request-Timestamp": ts}, nil, ""},
		{"slack-like, stale", `{"name":"hmac","header":"X-Slack-Signature","prefix":"v0=","timestamp_header":"X-Slack-Request-Timestamp","signed_content":"v0:{timestamp}:{body}","id_field":"event_id"}`,
			map[string]string{"X-Slack-Signature": "v0=" + hx("v0:"+stale+":"+body), "X-Slack-Request-Timestamp": stale}, dedup.ErrSignatureTimestamp, ""},
		{"slack-like, no timestamp", `{"name":"hmac","header":"X-Slack-Signature","prefix":"v0=","timestamp_header":"X-Slack-Request-Timestamp","signed_content":"v0:{timestamp}:{body}","id_field":"event_id"}`,
			map[string]string{"X-Slack-Signature": "v0=" + hx("v0:"+ts+":"+body)}, dedup.ErrSignatureMissing, ""},
		{"default timestamp template", `{"name":"hmac","header":"X-Sig","timestamp_header":"X-Ts","id_field":"event_id"}`,
			map[string]string{"X-Sig": hx(ts + "." + body), "X-Ts": ts}, nil, ""},
		{"twitch-like, signed id", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+rfc+body), "X-Ts": rfc, "X-Msg-Id": "msg_7"}, nil, "msg_7"},
		{"twitch-like, id changed", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+rfc+body), "X-Ts": rfc, "X-Msg-Id": "msg_8"}, dedup.ErrSignatureMismatch, ""},
		{"twitch-like, no fraction, an offset", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+rfcOffset+body), "X-Ts": rfcOffset, "X-Msg-Id": "msg_7"}, nil, "msg_7"},
		{"twitch-like, the same instant written another way than signed", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+rfc+body), "X-Ts": rfcOffset, "X-Msg-Id": "msg_7"}, dedup.ErrSignatureMismatch, ""},
		{"twitch-like, stale", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+rfcStale+body), "X-Ts": rfcStale, "X-Msg-Id": "msg_7"}, dedup.ErrSignatureTimestamp, ""},
		{"twitch-like, a Unix timestamp", twitchLike,
			map[string]string{"X-Sig": "sha256=" + hx("msg_7"+ts+body), "X-Ts": ts, "X-Msg-Id": "msg_7"}, dedup.ErrSignatureMalformed, ""},
		{"unix format, an RFC 3339 timestamp", `{"name":"hmac","header":"X-Sig","timestamp_header":"X-Ts","timestamp_format":"unix","signed_content":"{id}.{timestamp}.{body}","id_header":"X-Msg-Id"}`,
			map[string]string{"X-Sig": hx("msg_7." + rfc + "." + body), "X-Ts": rfc, "X-Msg-Id": "msg_7"}, dedup.ErrSignatureMalformed, ""},
		{"id and unix timestamp kept apart", `{"name":"hmac","header":"X-Sig","timestamp_header":"X-Ts","signed_content":"{id}_{timestamp}.{body}","id_header":"X-Msg-Id"}`,
			map[string]string{"X-Sig": hx("msg_7_" + ts + "." + body), "X-Ts": ts, "X-Msg-Id": "msg_7"}, nil, "msg_7"},
		{"suffix", `{"name":"hmac","header":"X-Sig","signed_content":"{body}|end","id_field":"event_id","encoding":"base64"}`,
			map[string]string{"X-Sig": base64.StdEncoding.EncodeToString(mac(body + "|end"))}, nil, ""},
		{"upper-case hex", `{"name":"hmac","header":"X-Sig","id_field":"event_id"}`,
			map[string]string{"X-Sig": strings.ToUpper(hx(body))}, nil, ""},
		{"missing prefix", `{"name":"hmac","header":"X-Sig","prefix":"sha256=","id_field":"event_id"}`,
			map[string]string{"X-Sig": hx(body)}, ErrSignaturePrefix, ""},
		{"short MAC", `{"name":"hmac","header":"X-Sig","id_field":"event_id"}`,
			map[string]string{"X-Sig": hx(body)[:62]}, ErrSignatureEncoding, ""},
		{"base64 without padding", `{"name":"hmac","header":"X-Sig","id_field":"event_id","encoding":"base64"}`,
			map[string]string{"X-Sig": strings.TrimRight(base64.StdEncoding.EncodeToString(mac(body)), "=")}, ErrSignatureEncoding, ""},
		{"no signature", `{"name":"hmac","header":"X-Sig","id_field":"event_id"}`,
			map[string]string{}, dedup.ErrSignatureMissing, ""},
	} {
		p := newProvider(t, c.provider, []string{"other_secret", secret1}, testNow)
		vd, err := p.Verify(post(body, c.headers), []byte(body))
		if !errors.Is(err, c.err) || err == nil && vd.ID != c.id {
			t.Errorf("%s: %q %v, want %q %v", c.name, vd.ID, err, c.id, c.err)
		}
	}
	// Two signature headers: which one would a backend read?
	p := newProvider(t, `{"name":"github"}`, []string{ghSecret1}, testNow)
	r := post("Hello, World!", nil)
	r.Header.Add("X-Hub-Signature-256", githubSig("Hello, World!", ghSecret1))
	r.Header.Add("X-Hub-Signature-256", githubSig("Hello, World!", ghSecret1))
	if _, err := p.Verify(r, []byte("Hello, World!")); !errors.Is(err, ErrSignatureCount) {
		t.Errorf("two signature headers: %v", err)
	}
}

// flipLastByte returns the signature enc (hex, either case, or padded
// base64) with the low bit of its last decoded byte flipped.
func flipLastByte(t *testing.T, enc string, b64 bool) string {
	t.Helper()
	var raw []byte
	var err error
	if b64 {
		raw, err = base64.StdEncoding.DecodeString(enc)
	} else {
		raw, err = hex.DecodeString(enc)
	}
	if err != nil || len(raw) == 0 {
		t.Fatalf("%q: %v", enc, err)
	}
	raw[len(raw)-1] ^= 1
	if b64 {
		return base64.StdEncoding.EncodeToString(raw)
	}
	return hex.EncodeToString(raw)
}

// TestWholeSignatureIsCompared: each provider refuses its right
// signature with only the last byte changed, so every byte of the MAC is
// compared, not a prefix of it.
func TestWholeSignatureIsCompared(t *testing.T) {
	const body = `{"id":"evt_1","type":"t"}`
	gh := strings.TrimPrefix(githubSig(body, ghSecret1), "sha256=")
	shop := shopifySig(body, ghSecret1)
	m := hmac.New(sha512.New, []byte(ghSecret1))
	m.Write([]byte(body))
	h512 := hex.EncodeToString(m.Sum(nil))
	for _, c := range []struct {
		provider, header, right, wrong string
	}{
		{`{"name":"github"}`, "X-Hub-Signature-256", "sha256=" + gh, "sha256=" + flipLastByte(t, gh, false)},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", shop, flipLastByte(t, shop, true)},
		{`{"name":"hmac","header":"X-Sig","algorithm":"sha512","id_field":"id"}`, "X-Sig", h512, flipLastByte(t, h512, false)},
	} {
		p := newProvider(t, c.provider, []string{ghSecret1}, testNow)
		if _, err := p.Verify(post(body, map[string]string{c.header: c.right}), []byte(body)); err != nil {
			t.Errorf("%s, the right signature: %v", c.provider, err)
		}
		if _, err := p.Verify(post(body, map[string]string{c.header: c.wrong}), []byte(body)); !errors.Is(err, dedup.ErrSignatureMismatch) {
			t.Errorf("%s, the last byte changed: %v, want a mismatch", c.provider, err)
		}
	}
	// Standard Webhooks: the v1 entry with its last byte changed.
	hdr := http.Header{}
	swSign(t, hdr, "msg_1", testNow, body, swSecret1)
	sig := hdr.Get("webhook-signature")
	p := newProvider(t, `{"name":"standard_webhooks"}`, []string{swSecret1}, testNow)
	wrong := "v1," + flipLastByte(t, strings.TrimPrefix(sig, "v1,"), true)
	if _, err := p.Verify(post(body, map[string]string{"webhook-id": "msg_1", "webhook-timestamp": hdr.Get("webhook-timestamp"), "webhook-signature": wrong}), []byte(body)); !errors.Is(err, dedup.ErrSignatureMismatch) {
		t.Errorf("standard_webhooks, the last byte changed: %v, want a mismatch", err)
	}
}

// TestRotationAnyPosition: during a rotation the matching secret, or the
// matching signature, may be any of several, first included: the
// receiver holding old and new accepts a delivery signed with the old
// (listed first), and a Standard Webhooks header whose right entry comes
// before a wrong one.
func TestRotationAnyPosition(t *testing.T) {
	const body = `{"id":"evt_1","type":"t"}`
	for _, c := range []struct {
		provider, header, sig, secret1, secret2 string
	}{
		{`{"name":"github"}`, "X-Hub-Signature-256", githubSig(body, ghSecret1), ghSecret1, ghSecret2},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", shopifySig(body, shopSecret1), shopSecret1, ghSecret2},
		{`{"name":"hmac","header":"X-Sig","prefix":"sha256=","id_field":"id"}`, "X-Sig", githubSig(body, ghSecret1), ghSecret1, ghSecret2},
	} {
		p := newProvider(t, c.provider, []string{c.secret1, c.secret2}, testNow)
		if _, err := p.Verify(post(body, map[string]string{c.header: c.sig}), []byte(body)); err != nil {
			t.Errorf("%s, signed with the first of two secrets: %v", c.provider, err)
		}
	}
	sw := newProvider(t, `{"name":"standard_webhooks"}`, []string{swSecret1, swSecret2}, testNow)
	for _, order := range [][]string{{swSecret1}, {swSecret2}, {swSecret1, "whsec_" + base64.StdEncoding.EncodeToString([]byte("not configured"))}} {
		hdr := http.Header{}
		swSign(t, hdr, "msg_1", testNow, body, order...)
		r := post(body, nil)
		r.Header = hdr
		if _, err := sw.Verify(r, []byte(body)); err != nil {
			t.Errorf("standard_webhooks holding two secrets, signed with %d secret(s) %q: %v", len(order), hdr.Get("webhook-signature"), err)
		}
	}
}

// TestMACEncodingExactLength: a MAC is read only at its exact encoded
// length: the right hex or base64 with a character more, or a long
// value, is not a signature (and must not panic), whatever its prefix.
func TestMACEncodingExactLength(t *testing.T) {
	const body = `{"id":"evt_1","type":"t"}`
	gh := githubSig(body, ghSecret1)
	shop := shopifySig(body, ghSecret1)
	long := strings.Repeat("A", 400)
	for _, c := range []struct {
		provider, header, sig string
	}{
		{`{"name":"github"}`, "X-Hub-Signature-256", gh + "0"},
		{`{"name":"github"}`, "X-Hub-Signature-256", gh + "00"},
		{`{"name":"github"}`, "X-Hub-Signature-256", gh + strings.TrimPrefix(gh, "sha256=")},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", shop + "AAAA"},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", shop + shop},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", long},
		{`{"name":"hmac","header":"X-Sig","algorithm":"sha512","encoding":"base64","id_field":"id"}`, "X-Sig", long},
	} {
		p := newProvider(t, c.provider, []string{ghSecret1}, testNow)
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s, %d-character signature: panic %v", c.provider, len(c.sig), v)
				}
			}()
			_, err := p.Verify(post(body, map[string]string{c.header: c.sig}), []byte(body))
			if !errors.Is(err, ErrSignatureEncoding) {
				t.Errorf("%s, %d-character signature: %v, want %v", c.provider, len(c.sig), err, ErrSignatureEncoding)
			} else if strings.Contains(err.Error(), c.sig[len(c.sig)-16:]) {
				t.Errorf("%s: the error carries the signature: %v", c.provider, err)
			}
		}()
	}
}

// TestStandardWebhooksEmptyKeyRefused: a whsec_ secret with nothing
// after the prefix (a config slip, an unset variable pasted after it) is
// a config error, not an HMAC key of zero bytes that anyone can sign
// with.
func TestStandardWebhooksEmptyKeyRefused(t *testing.T) {
	for _, secret := range []string{"whsec_", ""} {
		p := &StandardWebhooks{}
		err := p.Init(dedup.ProviderConfig{Secrets: []string{swSecret1, secret}, SignatureHeader: swSignature,
			EventIDHeaders: []string{swID}, Tolerance: DefaultTolerance, Now: func() time.Time { return testNow }})
		if err == nil || !strings.Contains(err.Error(), "secret #2") {
			t.Errorf("secret %q: %v, want an error naming secret #2", secret, err)
			continue
		}
	}
	// Had it been accepted, this is the delivery anyone could forge.
	m := hmac.New(sha256.New, nil)
	m.Write([]byte("msg_1." + strconv.FormatInt(testNow.Unix(), 10) + ".{}"))
	forged := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	p := newProvider(t, `{"name":"standard_webhooks"}`, []string{swSecret1}, testNow)
	r := post("{}", map[string]string{"webhook-id": "msg_1", "webhook-timestamp": strconv.FormatInt(testNow.Unix(), 10), "webhook-signature": forged})
	if _, err := p.Verify(r, []byte("{}")); !errors.Is(err, dedup.ErrSignatureMismatch) {
		t.Errorf("a delivery signed with an empty key: %v, want a mismatch", err)
	}
}

// TestStandardWebhooksEntryCap: a webhook-signature header with more
// than maxSWSignatures entries is refused before any is checked (each
// v1a entry costs an Ed25519 verification per public key), even when
// one of them is right; 16 are looked at.
func TestStandardWebhooksEntryCap(t *testing.T) {
	const body = `{"type":"user.created"}`
	hdr := http.Header{}
	swSign(t, hdr, "msg_1", testNow, body, swSecret1)
	right := hdr.Get("webhook-signature")
	filler := "v1a," + base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))
	p := newProvider(t, `{"name":"standard_webhooks"}`, []string{swSecret1}, testNow)
	for _, c := range []struct {
		fillers int
		want    error
	}{
		{15, nil},
		{16, ErrTooManySignatures},
		{5000, ErrTooManySignatures},
	} {
		sig := strings.TrimSpace(strings.Repeat(filler+" ", c.fillers) + right)
		r := post(body, map[string]string{"webhook-id": "msg_1", "webhook-timestamp": hdr.Get("webhook-timestamp"), "webhook-signature": sig})
		if _, err := p.Verify(r, []byte(body)); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%d other entries and the right one: %v, want %v", c.fillers, err, c.want)
		}
	}
}

// TestStandardWebhooksEntries: every v1a entry is checked (a sender
// rotating its Ed25519 key sends one per key, the new one possibly
// second), and an entry too long for its version is skipped, not a
// panic.
func TestStandardWebhooksEntries(t *testing.T) {
	oldKey := ed25519.NewKeyFromSeed([]byte("another seed, another key, 32 by"))
	newKey := ed25519.NewKeyFromSeed([]byte("sangho_dedup v1a test seed, 32 b"))
	newPub := "whpk_" + base64.StdEncoding.EncodeToString(newKey.Public().(ed25519.PublicKey))
	id, ts, body := "msg_v1a_1", strconv.FormatInt(testNow.Unix(), 10), `{"type":"user.created"}`
	sign := func(k ed25519.PrivateKey) string {
		return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(k, []byte(id+"."+ts+"."+body)))
	}
	p := newProvider(t, `{"name":"standard_webhooks"}`, []string{newPub}, testNow)
	verify := func(sig string) error {
		t.Helper()
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("%.40q...: panic %v", sig, v)
			}
		}()
		_, err := p.Verify(post(body, map[string]string{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig}), []byte(body))
		return err
	}
	if err := verify(sign(oldKey) + " " + sign(newKey)); err != nil {
		t.Errorf("old key's v1a, then the new key's: %v, want accepted", err)
	}
	if err := verify(sign(newKey) + " " + sign(oldKey)); err != nil {
		t.Errorf("new key's v1a, then the old key's: %v, want accepted", err)
	}
	for _, long := range []string{"v1," + strings.Repeat("A", 400), "v1a," + strings.Repeat("A", 400)} {
		if err := verify(long + " " + sign(newKey)); err != nil {
			t.Errorf("a %d-character entry, then the right one: %v, want accepted", len(long), err)
		}
		if err := verify(long); !errors.Is(err, dedup.ErrSignatureMalformed) {
			t.Errorf("only a %d-character entry: %v, want malformed", len(long), err)
		}
	}
}

// TestSignatureCountErrorCarriesNoSignature: the error for a signature
// header sent twice names the header, not the values (it is logged).
func TestSignatureCountErrorCarriesNoSignature(t *testing.T) {
	const body = "Hello, World!"
	sig := githubSig(body, ghSecret1)
	p := newProvider(t, `{"name":"github"}`, []string{ghSecret1}, testNow)
	r := post(body, nil)
	r.Header.Add("X-Hub-Signature-256", sig)
	r.Header.Add("X-Hub-Signature-256", "sha256="+strings.Repeat("ab", 32))
	_, err := p.Verify(r, []byte(body))
	if !errors.Is(err, ErrSignatureCount) {
		t.Fatalf("two signature headers: %v", err)
	}
	if msg := err.Error(); strings.Contains(msg, sig[7:23]) || strings.Contains(msg, "abababab") || !strings.Contains(msg, "X-Hub-Signature-256") {
		t.Errorf("error %q: want the header's name and no signature value", msg)
	}
}

// TestMismatchErrorCarriesNoMAC: a mismatch error (logged) carries
// neither the signature sent nor the MAC computed: the latter is a
// valid signature for the sender's body, forgeable by whoever reads the
// log.
func TestMismatchErrorCarriesNoMAC(t *testing.T) {
	const body = `{"forged":true}`
	right := githubSig(body, ghSecret1)
	shop := shopifySig(body, ghSecret1)
	for _, c := range []struct{ provider, header, sent, right string }{
		{`{"name":"github"}`, "X-Hub-Signature-256", "sha256=" + strings.Repeat("ab", 32), right[7:]},
		{`{"name":"shopify"}`, "X-Shopify-Hmac-Sha256", shopifySig(body, ghSecret2), shop},
	} {
		p := newProvider(t, c.provider, []string{ghSecret1}, testNow)
		_, err := p.Verify(post(body, map[string]string{c.header: c.sent}), []byte(body))
		if !errors.Is(err, dedup.ErrSignatureMismatch) {
			t.Fatalf("%s: %v, want a mismatch", c.provider, err)
		}
		msg := strings.ToLower(err.Error())
		rawRight, _ := base64.StdEncoding.DecodeString(c.right)
		if strings.Contains(msg, strings.ToLower(c.right[:16])) || strings.Contains(msg, hex.EncodeToString(rawRight)[:16]) || strings.Contains(msg, strings.ToLower(c.sent[len(c.sent)-16:])) {
			t.Errorf("%s: error %q carries a MAC", c.provider, err)
		}
	}
}
