// Package sanghodedup is a Caddy HTTP handler that makes any webhook
// backend idempotent for at-least-once deliveries: it buffers the body
// (bounded), verifies the sender's signature (Sangho's by default;
// Stripe, Standard Webhooks, GitHub, Shopify, a generic HMAC, or a provider
// another plugin adds), claims the event ID atomically in a store (a
// file, Redis, PostgreSQL or memory), answers duplicates itself, passes
// new events to the next handler, and records an event as done only
// once the backend has answered 2xx. A failed attempt is released so
// that the sender's retry is processed.
package sanghodedup

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/providers"

	// The modules this handler loads by default: every store and every
	// provider registers itself.
	_ "github.com/sangho/caddy-sangho-dedup/stores/file"
	_ "github.com/sangho/caddy-sangho-dedup/stores/memory"
	_ "github.com/sangho/caddy-sangho-dedup/stores/postgres"
	_ "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

func init() {
	caddy.RegisterModule(Handler{})
	cfargs.Options(Handler{})
}

// Defaults.
const (
	DefaultTolerance       = providers.DefaultTolerance
	DefaultMaxBodySize     = 1 << 20
	DefaultEventIDHeader   = providers.SanghoEventIDHeader
	DefaultSignatureHeader = providers.SanghoSignatureHeader
	DefaultRetention       = 72 * time.Hour
	DefaultLockTTL         = 30 * time.Second
	DefaultRetryAfter      = 10 * time.Second
	DefaultKeyPrefix       = "sangho_dedup:"

	// RedeliveryWindow is how long after its first attempt Sangho may
	// still deliver an event; a shorter retention gives up the promise.
	RedeliveryWindow = 48 * time.Hour

	// MaxTolerance bounds tolerance. Every built-in sender signs each
	// attempt afresh and asks for minutes (Stripe, Standard Webhooks,
	// Slack 5m, Twitch 10m); a week covers a sender that keeps its
	// first timestamp through days of retries, and anything longer keeps
	// a captured delivery valid so long that the timestamp protects
	// nothing.
	MaxTolerance = 7 * 24 * time.Hour

	// MaxMaxBodySize bounds max_body_size: every body is held in memory
	// whole until the backend has read it.
	MaxMaxBodySize = 64 << 20

	// minLockTTL keeps renewals (every lock_ttl/3) meaningful.
	minLockTTL = 30 * time.Millisecond

	// MinWindow is the least tolerance and retention: under a second
	// no sender's clock or retries fit, and in JSON a bare number is
	// nanoseconds ("retention": 259200 is 259 µs, not 3 days).
	MinWindow = time.Second
	// MaxRetention bounds retention: 10 years (3650d), far beyond any
	// sender's redeliveries, and far from the year 2262 where Unix
	// nanoseconds end.
	MaxRetention = 3650 * 24 * time.Hour
	// MaxLockTTL bounds lock_ttl: 24 hours. An event whose fate is
	// unknown (a timeout, a crash) is processed again only after
	// lock_ttl; Sangho stops redelivering after 48 hours.
	MaxLockTTL = 24 * time.Hour
	// MaxRetryAfter bounds retry_after: 24 hours.
	MaxRetryAfter = 24 * time.Hour
)

// redeliveryWindows is how long after its first attempt each sender may
// deliver an event again, by its retries or a redelivery its dashboard
// offers; a retention under it warns at load. (hmac's sender is not
// known.)
var redeliveryWindows = map[string]time.Duration{
	"sangho":            RedeliveryWindow,
	"stripe":            72 * time.Hour, // retries for up to 3 days (live mode)
	"github":            72 * time.Hour, // no retries; redeliveries of the last 3 days, from its UI or API
	"shopify":           4 * time.Hour,  // 8 retries over 4 hours (since 2024-09)
	"standard_webhooks": 28 * time.Hour, // Svix's schedule: its last attempt 27 h 35 m after the first
}

// Values of on_store_error and on_payload_mismatch.
const (
	storeErrorReject = "reject" // on_store_error: answer 503
	storeErrorPass   = "pass"   // on_store_error: pass the event on unchecked

	mismatchReject = "reject" // on_payload_mismatch: answer 422
	mismatchLog    = "log"    // on_payload_mismatch: answer the duplicate, log a warning
)

// Handler verifies and deduplicates webhook deliveries in front of any
// backend: Sangho's by default, another sender's with `verifier` (a
// provider of http.sangho_dedup.providers: `stripe`, `standard_webhooks`,
// `github`, `shopify`, `hmac`). It reads the body (at most
// `max_body_size`), verifies the signature, takes the event ID (from the
// signed body, or from a header), claims the ID in the `store`, passes a
// new event to the next handler while holding a lease on it (`lock_ttl`),
// and records the event as done once the next handler has answered 2xx.
// A duplicate is answered without the next handler. Rejections are
// returned as Caddy errors, so that `handle_errors` can shape them; no
// rejected request reaches the next handler or leaves a key in the store.
//
// Answers, checked in this order:
//
// Case | Status | Headers, body
// -----|--------|--------------
// method other than POST | 405 | `Allow: POST`
// body longer than `max_body_size` (declared or counted, chunked too) | 413 |
// body cannot be read (truncated, client gone) | 400 |
// signature missing, malformed or sent twice, matching no `secret`, or its timestamp outside `tolerance` | 401 |
// no valid event ID (missing, not 1-255 characters of `[A-Za-z0-9_-]`, body and header IDs differ, two ID headers, a body without `"id"` with `require_body_id` on, an ambiguous body) | 400 |
// a signed message replayed under another event ID, where the signature does not cover the ID | 401 |
// event already processed | 200 | `Sangho-Dedup: duplicate`, `Content-Type: application/json`, body `{"received":true}`
// event processed with another body, `on_payload_mismatch` `reject` (the default) | 422 | `Sangho-Dedup: payload_mismatch`
// the same, `on_payload_mismatch` `log` | 200 | as a duplicate
// another delivery of the event in flight | 409 | `Sangho-Dedup: in_flight`, `Retry-After` (`retry_after`)
// store unreachable or failing, `on_store_error` `reject` (the default) | 503 | `Retry-After` (`retry_after`)
// store unreachable or failing, `on_store_error` `pass` | the next handler's | the next handler's, unchecked
// new event | the next handler's | the next handler's, untouched
//
// A new event ends as the next handler's answer says: a 2xx status (or
// none written, without an error) commits it, so that every later
// delivery is a duplicate; a non-2xx status, or an error showing that the
// request never left Caddy (a dial error, no upstreams available),
// releases it, so that the sender's retry is processed; any other error
// (a timeout, a connection lost, a panic), or the 499 reverse_proxy
// writes when the client went away mid-request, leaves unknown whether
// the backend got it: the lease is held until it expires (`lock_ttl`),
// then the retry is processed, marked (below). A marked delivery (below)
// that is not processed is held too, never released.
//
// A delivery that takes over an event whose earlier attempt's fate is
// unknown (its lease ran out: its Caddy died, or it was held), or one
// passed on unchecked (`on_store_error` `pass`), reaches the next
// handler with the request header `Sangho-Dedup-Prior-Attempt: unknown`,
// for a backend to check its own records; any such header a client sent
// is removed first.
//
// This handler sets the following placeholders:
//
// Placeholder | Description
// ------------|-------------
// `{http.sangho_dedup.event_id}` | the event ID, once known
// `{http.sangho_dedup.event_type}` | the event type: the body's top-level `type` (`github`: the X-GitHub-Event header; `shopify`: X-Shopify-Topic)
// `{http.sangho_dedup.outcome}` | how the delivery ended, one of the outcomes below
// `{http.sangho_dedup.prior_attempt}` | `unknown` when the delivery was passed on with `Sangho-Dedup-Prior-Attempt: unknown`, else empty
//
// Outcomes, also the values of the `outcome` label of the metric
// caddy_sangho_dedup_events_total:
//
// Outcome | Meaning
// --------|--------
// `processed` | the next handler answered 2xx: the event is recorded as done
// `processed_marked` | the same, for a delivery passed on with `Sangho-Dedup-Prior-Attempt: unknown` (it took over an earlier attempt whose fate is unknown)
// `duplicate` | already processed: answered 200 without the next handler
// `payload_mismatch` | already processed with another body: answered 422, or 200 with `on_payload_mismatch` `log`
// `in_flight` | another delivery of the event is in flight: answered 409
// `invalid_signature` | answered 401, and logged at warn, sampled: "signatures rejected", the first at once, then one line per 10 s with its `count`
// `bad_request` | answered 400 or 405
// `too_large` | answered 413
// `store_error` | the store failed: answered 503
// `unchecked` | the store failed, `on_store_error` `pass`: passed on without deduplication
// `released` | the next handler answered non-2xx or never reached the backend: the sender's retry is processed
// `held` | unknown whether the backend got the event, or a marked delivery not processed: its retry is processed after `lock_ttl`
type Handler struct {
	// Signing secrets, used as bytes, whole (whsec_ included; for
	// standard_webhooks, whsec_<base64> or a whpk_ public key). A request
	// is accepted when any v1 signature matches any secret, so old and new
	// secrets can be listed together during a rotation. Required.
	// A secret that is one whole placeholder, {env.SANGHO_WEBHOOK_SECRET}
	// or {file./run/secrets/sangho}, is resolved at provision, so the
	// secret needs not appear in the JSON config; resolving to an empty
	// value is an error. Any other value is the secret itself, taken
	// literally, braces included.
	Secrets []string `json:"secret,omitempty"`

	// How far the signature timestamp t may be from this server's clock,
	// in either direction, compared exactly (not in whole seconds); at
	// most 7 days (168h). Default: the provider's, 5m for every built-in
	// provider that signs a timestamp. A provider that signs none (github,
	// shopify, hmac without timestamp_header) refuses it.
	Tolerance caddy.Duration `json:"tolerance,omitempty"`

	// Largest accepted request body, in bytes, at most 64 MiB (67108864).
	// Default: 1 MiB (1048576).
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// Header that carries the event ID. Default: the provider's:
	// Sangho-Event-ID (sangho), none (stripe), webhook-id
	// (standard_webhooks), X-GitHub-Delivery (github), X-Shopify-Event-Id
	// then X-Shopify-Webhook-Id (shopify), id_header (hmac).
	EventIDHeader string `json:"event_id_header,omitempty"`

	// Header that carries the signature. Default: the provider's:
	// Sangho-Signature (sangho), Stripe-Signature (stripe),
	// webhook-signature (standard_webhooks), X-Hub-Signature-256 (github),
	// X-Shopify-Hmac-Sha256 (shopify), header (hmac).
	SignatureHeader string `json:"signature_header,omitempty"`

	// How long a processed event ID is remembered. Sangho never
	// redelivers after 48 hours; a shorter retention is allowed but
	// logged as a warning at load, since a later redelivery would be
	// processed again. At most 3650d (10 years). Default: 72h.
	Retention caddy.Duration `json:"retention,omitempty"`

	// Lease on an event while the backend processes it, renewed every
	// lock_ttl/3 while it is in flight. If this Caddy dies, the event can
	// be processed again after lock_ttl. At least 30ms, at most 24h.
	// Default: 30s.
	LockTTL caddy.Duration `json:"lock_ttl,omitempty"`

	// Retry-After sent with 409 and 503 answers. At most 24h.
	// Default: 10s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	// What to do when the store is unreachable or fails: "reject"
	// answers 503 (nothing is lost: Sangho retries), "pass" hands the
	// event to the backend unchecked (availability over exactly-once).
	// Default: reject.
	OnStoreError string `json:"on_store_error,omitempty"`

	// Prefix of every store key, so that several routes or tenants can
	// share one store. The default store is one file per Caddy, shared
	// by every site: endpoints with different secrets on it need
	// different prefixes. A name does not change the prefix.
	// Default: "sangho_dedup:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// How operators refer to this endpoint in the admin API
	// (/sangho_dedup/<name>/events/<id>) and `caddy sangho-dedup`.
	// Handlers of one config with the same name must use the same store
	// and key_prefix (the same endpoint on several routes). Default: the
	// key_prefix without its trailing colon ("sangho_dedup").
	Name string `json:"name,omitempty"`

	// What to answer when an event that was processed is delivered again
	// with another body (its fingerprint, the body's xxh64, is kept with
	// the done record; see docs/how-it-works.md): "reject" answers 422
	// with Sangho-Dedup: payload_mismatch and never reaches the backend;
	// "log" answers the usual 200 duplicate and logs a warning. Both
	// count as the outcome payload_mismatch. Default: reject with the
	// sangho provider (its contract: every attempt carries the same
	// bytes), log with the others, which promise no such thing.
	OnPayloadMismatch string `json:"on_payload_mismatch,omitempty"`

	// Whether a signed body must carry the event ID as its top-level
	// "id" (Sangho's bodies always do). The signature covers the body,
	// not the event ID header, so an ID taken from the header could be
	// replaced by whoever captured a delivery. On: a body without a
	// top-level "id" is answered 400. Off: the ID may come from the
	// header; each signed message (t and body) is then remembered in the
	// store, under key_prefix + "sig:" + its SHA-256, for twice the
	// tolerance, with the ID it first came with, and its reuse with
	// another ID is answered 401. Only for providers that take the ID from
	// the body (sangho, stripe, hmac with id_field; for hmac the field is
	// id_field); any other provider refuses it. Default: true.
	RequireBodyID *bool `json:"require_body_id,omitempty"`

	// The sender's provider (http.sangho_dedup.providers): sangho,
	// stripe, standard_webhooks, github, shopify or hmac, or one another
	// plugin adds. It sets the default headers, where the event ID comes
	// from and the default tolerance. Default: {"name": "sangho"}.
	ProviderRaw json.RawMessage `json:"provider,omitempty" caddy:"namespace=http.sangho_dedup.providers inline_key=name"`

	// Deprecated: the shape before v0.3, {"scheme": "<name>", ...};
	// accepted with a warning for one release, as provider.
	VerifierRaw json.RawMessage `json:"verifier,omitempty"`

	// The store module (http.sangho_dedup.stores). Default: file, a
	// durable database file in Caddy's data directory, for one instance;
	// redis or postgres for several instances; memory for tests.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.sangho_dedup.stores inline_key=type"`

	store      dedup.Store
	storeData  string   // dataOf(store): what other handlers and commits compare
	provider   provider // the sender's provider, settled at provision
	logger     *zap.Logger
	now        func() time.Time // the clock; a test sets its own before Provision
	pass       bool
	retryAfter string
	renewEvery time.Duration
	cfgKey     any // the config this handler belongs to (configOf)

	outcomes map[string]prometheus.Counter // caddy_sangho_dedup_events_total of this endpoint, by outcome

	requireBodyID bool
	sigMemory     time.Duration // how long a signed message's ID is remembered (the ID not signed)
	sigRejects    *sigRejectLog // the sampled warning for rejected signatures
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sangho_dedup",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, resolves the secrets, loads the store and
// registers the metrics.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.now == nil { // tests set their clock before Provision
		h.now = time.Now
	}
	if h.Retention == 0 {
		h.Retention = caddy.Duration(DefaultRetention)
	}
	if h.LockTTL == 0 {
		h.LockTTL = caddy.Duration(DefaultLockTTL)
	}
	if h.RetryAfter == 0 {
		h.RetryAfter = caddy.Duration(DefaultRetryAfter)
	}
	if h.OnStoreError == "" {
		h.OnStoreError = storeErrorReject
	}
	if h.KeyPrefix == "" {
		h.KeyPrefix = DefaultKeyPrefix
	}
	if err := checkKeyPrefix(h.KeyPrefix); err != nil { // before the default name, a metric label, is made from it
		return err
	}
	if h.Name == "" {
		h.Name = defaultName(h.KeyPrefix)
	}
	// Every line says which endpoint it is about.
	h.logger = h.logger.With(zap.String("name", h.Name))
	h.pass = h.OnStoreError == storeErrorPass
	if h.pass {
		h.logger.Warn("on_store_error pass: a failing store lets deliveries through unchecked",
			zap.String("why", "while the store fails, each delivery reaches the backend without a claim, its redeliveries too: the backend must be idempotent itself then"))
	}
	h.renewEvery = time.Duration(h.LockTTL) / 3
	h.requireBodyID = h.RequireBodyID == nil || *h.RequireBodyID
	secs := (time.Duration(h.RetryAfter) + time.Second - 1) / time.Second
	h.retryAfter = strconv.FormatInt(int64(secs), 10)

	repl := caddy.NewReplacer()
	secrets := make([]string, 0, len(h.Secrets))
	for i, s := range h.Secrets {
		secret, err := resolveSecret(repl, i+1, s)
		if err != nil {
			return err
		}
		if secret == s && (strings.Contains(s, "{env.") || strings.Contains(s, "{file.")) {
			h.logger.Warn("secret taken literally", zap.Int("secret", i+1))
		}
		if strings.ContainsFunc(secret, unicode.IsControl) {
			h.logger.Warn("secret holds a control character", zap.Int("secret", i+1),
				zap.String("why", "no sender signs with one: a line break left from a file or a pasted value? Every delivery signed with the secret meant is refused (401)"))
		}
		secrets = append(secrets, secret)
	}
	if len(secrets) == 0 {
		return errors.New("at least one secret is required")
	}
	providerKey := "provider"
	if h.VerifierRaw != nil {
		providerKey = `verifier (deprecated, read as "provider")` // the key written
	}
	if err := h.upgradeVerifier(); err != nil {
		return err
	}
	if h.ProviderRaw == nil {
		h.ProviderRaw = json.RawMessage(`{"name":"sangho"}`)
	}
	pmod, err := ctx.LoadModule(h, "ProviderRaw")
	if err != nil {
		return fmt.Errorf("%s: %w", providerKey, err)
	}
	v, ok := pmod.(dedup.Provider)
	if !ok {
		return fmt.Errorf("%s: module %T is not a sangho_dedup provider", providerKey, pmod)
	}
	name := v.(caddy.Module).CaddyModule().ID.Name()
	if name == "stripe" {
		if err := h.checkStripeSecrets(secrets); err != nil {
			return fmt.Errorf("%s %s: %w", providerKey, name, err)
		}
	}
	if err := h.setupProvider(v, name, secrets); err != nil {
		return fmt.Errorf("%s %s: %w", providerKey, name, err)
	}
	if h.MaxBodySize == 0 { // the provider's, else the handler's default
		h.MaxBodySize = DefaultMaxBodySize
		if d := h.provider.defaults.MaxBodySize; d > 0 {
			h.MaxBodySize = min(d, MaxMaxBodySize)
		}
	}
	if h.OnPayloadMismatch == "" {
		// Sangho's contract: every attempt carries the same body bytes.
		// Other senders do not promise it (a retry may carry a changed
		// field), and a 422 would fail their retries: a warning there.
		h.OnPayloadMismatch = mismatchLog
		if name == "sangho" {
			h.OnPayloadMismatch = mismatchReject
		}
	}
	if r, window := time.Duration(h.Retention), redeliveryWindows[name]; r > 0 && r < window {
		h.logger.Warn("retention shorter than redelivery window", zap.String("provider", name),
			zap.Duration("retention", r), zap.Duration("redelivery_window", window))
	}

	if h.StoreRaw == nil {
		h.StoreRaw = json.RawMessage(`{"type":"file"}`)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	store, ok := mod.(dedup.Store)
	if !ok {
		return fmt.Errorf("module %T is not a sangho_dedup store", mod)
	}
	h.store, h.storeData = store, dataOf(store)
	noteExitParker(store)
	onExitOnce.Do(func() { caddy.OnExit(drainCommitRetries) })
	if err := h.registerEndpoint(ctx, secrets); err != nil {
		return err
	}
	h.warnOpenPaths(ctx)
	h.sigRejects = &sigRejectLog{every: sigRejectEvery, logger: h.logger}
	h.outcomes = outcomeCounters(h.Name)
	return registerMetrics(ctx.GetMetricsRegistry())
}

// defaultName is the name of an endpoint that has none: its key_prefix
// without the trailing colon, which would show in every admin URL and in
// the command's output ("sangho_dedup:" is named "sangho_dedup").
func defaultName(keyPrefix string) string {
	if n := strings.TrimSuffix(keyPrefix, ":"); n != "" {
		return n
	}
	return keyPrefix
}

// resolveSecret returns the n-th secret: the value of s if s is one
// whole placeholder ({env.X}, {file./path}), else s itself, braces and
// all. Resolving placeholders inside a longer value would mangle a
// literal secret that holds braces (whsec_ab{cd}ef would become
// whsec_abef) and turn an unset variable into a shorter, weaker secret.
// Errors name the secret by its number and a placeholder by its name,
// never by a value.
func resolveSecret(repl *caddy.Replacer, n int, s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("secret #%d is empty", n)
	}
	if len(s) < 3 || s[0] != '{' || s[len(s)-1] != '}' || strings.ContainsAny(s[1:len(s)-1], "{}") {
		return s, nil
	}
	name := s[1 : len(s)-1]
	v, known := repl.GetString(name)
	switch {
	case !known:
		// Not a placeholder name: perhaps a literal secret in braces,
		// which must not be printed.
		return "", fmt.Errorf("secret #%d is a placeholder that Caddy does not know: a secret that is one whole {...} is resolved as a placeholder such as {env.X} or {file./path}", n)
	case v == "":
		return "", fmt.Errorf("secret #%d: placeholder {%s} is unset or empty", n, name)
	}
	return v, nil
}

// minIfSet is MinWindow for a tolerance given, 0 for none (a provider
// without timestamps; Provision sets the default of one with).
func minIfSet(tolerance caddy.Duration) time.Duration {
	if tolerance == 0 {
		return 0
	}
	return MinWindow
}

// checkStripeSecrets refuses a Stripe API key (sk_, rk_) given as a
// signing secret, which no delivery is signed with and which must not
// sit in a web server's config, and warns of any other secret without
// whsec_, the prefix of Stripe's endpoint signing secrets. Neither names
// the value.
func (h *Handler) checkStripeSecrets(secrets []string) error {
	for i, s := range secrets {
		switch {
		case strings.HasPrefix(s, "sk_") || strings.HasPrefix(s, "rk_"):
			return fmt.Errorf("secret #%d is a Stripe API key (sk_ or rk_), not the endpoint's signing secret (whsec_..., in the Dashboard's webhook endpoint, or printed by stripe listen): give the signing secret, and keep API keys out of this config", i+1)
		case !strings.HasPrefix(s, "whsec_"):
			h.logger.Warn("secret is not a Stripe signing secret", zap.Int("secret", i+1),
				zap.String("fix", "Stripe signs with the endpoint's signing secret, whsec_...; deliveries will be refused (401) unless it is one"))
		}
	}
	return nil
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	if err := h.validateProvider(); err != nil {
		return err
	}
	for _, b := range []struct {
		name        string
		v, min, max time.Duration
	}{
		{"tolerance", time.Duration(h.Tolerance), minIfSet(h.Tolerance), MaxTolerance},
		{"retention", time.Duration(h.Retention), MinWindow, MaxRetention},
		{"lock_ttl", time.Duration(h.LockTTL), minLockTTL, MaxLockTTL},
		{"retry_after", time.Duration(h.RetryAfter), 0, MaxRetryAfter},
	} {
		if err := cfargs.Bounds(b.name, b.v, b.min, b.max); err != nil {
			if b.v >= 0 && b.v < time.Millisecond { // as nobody writes a string
				return fmt.Errorf("%w (in JSON a duration given as a number is nanoseconds: write a string such as \"5m\" or \"72h\")", err)
			}
			return err
		}
	}
	switch {
	case h.provider.timestamp && h.Tolerance <= 0:
		return errors.New("tolerance must be positive")
	case h.MaxBodySize <= 0:
		return errors.New("max_body_size must be positive")
	case h.MaxBodySize > MaxMaxBodySize:
		return fmt.Errorf("max_body_size must be at most %d bytes (64MiB), not %d", MaxMaxBodySize, h.MaxBodySize)
	case h.Retention <= 0:
		return errors.New("retention must be positive")
	case h.provider.timestamp && time.Duration(h.Retention) < 2*time.Duration(h.Tolerance):
		// A signature is valid while the clock is within tolerance of its
		// timestamp, either way: a delivery replayed after its record
		// expired, its signature still valid, would be processed again.
		return fmt.Errorf("retention (%v) must be at least twice tolerance (%v): a signature stays valid for tolerance either side of its timestamp, and a delivery replayed after its done record expired would be processed again",
			time.Duration(h.Retention), time.Duration(h.Tolerance))
	case h.RetryAfter <= 0:
		return errors.New("retry_after must be positive")
	case h.OnStoreError != storeErrorReject && h.OnStoreError != storeErrorPass:
		return fmt.Errorf("on_store_error must be %q or %q, not %q", storeErrorReject, storeErrorPass, h.OnStoreError)
	case h.OnPayloadMismatch != mismatchReject && h.OnPayloadMismatch != mismatchLog:
		return fmt.Errorf("on_payload_mismatch must be %q or %q, not %q", mismatchReject, mismatchLog, h.OnPayloadMismatch)
	case h.EventIDHeader != "" && !httpguts.ValidHeaderFieldName(h.EventIDHeader):
		return fmt.Errorf("event_id_header %q is not a valid header name", h.EventIDHeader)
	case !httpguts.ValidHeaderFieldName(h.SignatureHeader):
		return fmt.Errorf("signature_header %q is not a valid header name", h.SignatureHeader)
	}
	return checkKeyPrefix(h.KeyPrefix)
}

// checkKeyPrefix refuses a key_prefix that a store could not hold whole
// (PostgreSQL refuses a NUL; every key would fail) or that would not be
// the prefix meant.
func checkKeyPrefix(p string) error {
	switch {
	case !utf8.ValidString(p):
		return fmt.Errorf("key_prefix %q is not UTF-8 text", p)
	case strings.ContainsFunc(p, unicode.IsSpace):
		return fmt.Errorf("key_prefix %q must not contain white space", p)
	case strings.ContainsFunc(p, unicode.IsControl):
		return fmt.Errorf("key_prefix %q must not contain control characters", p)
	case strings.ContainsAny(p, "{}"):
		// Placeholders are not expanded in key_prefix: {env.TENANT}: would
		// be the prefix itself, the same for every tenant.
		return fmt.Errorf("key_prefix %q holds a placeholder, which is not expanded: write the prefix itself (in a Caddyfile, {$VAR} is read when the Caddyfile is adapted)", p)
	}
	return nil
}

// UnmarshalJSON decodes the JSON config as Caddy does, a bad duration
// answered with its key (cfargs.DecodeJSON).
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler // without this method
	return cfargs.DecodeJSON(b, (*plain)(h))
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// upgradeVerifier turns the deprecated JSON shape "verifier":
// {"provider": "<name>", ...} into "provider": {"name": "<name>", ...},
// with a warning.
func (h *Handler) upgradeVerifier() error {
	if h.VerifierRaw == nil {
		return nil
	}
	if h.ProviderRaw != nil {
		return errors.New(`verifier: deprecated, and provider is set too: keep "provider" only`)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(h.VerifierRaw, &obj); err != nil {
		return fmt.Errorf("verifier: %w", err)
	}
	name, ok := obj["scheme"]
	if !ok {
		return errors.New(`verifier: no "scheme" (and "verifier" is deprecated: use "provider": {"name": ...})`)
	}
	delete(obj, "scheme")
	obj["name"] = name
	raw, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("verifier: %w", err)
	}
	h.ProviderRaw, h.VerifierRaw = raw, nil
	h.logger.Warn(`"verifier" is deprecated and will be removed in the next release: write "provider": {"name": ...}`,
		zap.ByteString("provider", name))
	return nil
}
