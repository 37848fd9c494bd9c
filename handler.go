package sanghodedup

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

var (
	errMethod   = errors.New("method not allowed: Sangho delivers webhooks with POST")
	errInFlight = errors.New("another delivery of this event is being processed")
	// errClaimsLate: the claim, and lateClaims claims made again after
	// it, each answered after lock_ttl/3 (see serve).
	errClaimsLate = errors.New("the store answered every claim of the event after lock_ttl/3")
	errStore      = errors.New("dedup store unavailable")
	// errPayloadMismatch: the event ID was processed with another body.
	errPayloadMismatch = errors.New("this event ID was processed with another body")
)

var duplicateBody = []byte(`{"received":true}`)

// headerPriorAttempt is set to "unknown" on a delivery passed on when an
// earlier attempt of the event may have reached the backend with a fate
// nobody knows (dedup.Reclaimed: its lease ran out, its Caddy died or it
// was held after a timeout), or when the handler cannot vouch that it is
// the first attempt (passed unchecked, on_store_error pass). A backend
// that checks its own records for the event ID when it is present,
// atomically with its work, closes the crash window. The handler always
// strips the header a client sends.
const headerPriorAttempt = "Sangho-Dedup-Prior-Attempt"

// lateClaims is how many times a delivery's claim is made again when
// each answer came after lock_ttl/3 (see serve): then the store is
// failing.
const lateClaims = 3

// isPriorAttempt is whether the header name k is Sangho-Dedup-Prior-Attempt
// in any case, with '_' for '-'.
func isPriorAttempt(k string) bool {
	return len(k) == len(headerPriorAttempt) && strings.EqualFold(strings.ReplaceAll(k, "_", "-"), headerPriorAttempt)
}

// namesPriorAttempt is whether the Connection header's values name
// Sangho-Dedup-Prior-Attempt.
func namesPriorAttempt(conn []string) bool {
	for _, v := range conn {
		for tok := range strings.SplitSeq(v, ",") {
			if isPriorAttempt(strings.TrimSpace(tok)) {
				return true
			}
		}
	}
	return false
}

// markPriorAttempt marks a delivery about to be passed on (see
// headerPriorAttempt) and sets {http.sangho_dedup.prior_attempt}.
func markPriorAttempt(r *http.Request, repl *caddy.Replacer) {
	r.Header.Set(headerPriorAttempt, "unknown")
	repl.Set("http.sangho_dedup.prior_attempt", "unknown")
}

// ServeHTTP verifies, deduplicates and passes on one delivery.
//
// An error it returns (a rejection, where the server has error routes,
// or the next handler's failure) makes Caddy run the server's error
// routes with this request: they get it without its body, so that a
// failover there (handle_errors { reverse_proxy fallback }) never
// processes a delivery that was refused, or released or held by this
// handler (which cannot see what an error route does with it).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (err error) {
	returned := false
	defer func() {
		if err != nil || !returned { // a panic goes to Caddy's error handling too
			withholdBody(r)
		}
	}()
	err = h.serve(w, r, next)
	returned = true
	return err
}

// servedVar is the request's variable a sangho_dedup sets, to its
// name, when it starts on the request (see serve).
const servedVar = "sangho_dedup.name"

// errNested is the error of a request refused by a sangho_dedup that
// another one handles already (see serve).
var errNested = errors.New("sangho_dedup twice on one request")

// withholdBody leaves r without a body, for the error routes (see
// ServeHTTP). The pooled body's buffer goes back to the pool once its
// reader, if any, is done with it.
func withholdBody(r *http.Request) {
	if b, ok := r.Body.(*pooledBody); ok {
		_ = b.Close()
	}
	r.Body, r.GetBody = http.NoBody, nil
	r.ContentLength, r.TransferEncoding, r.Trailer = 0, nil, nil
}

// serve is ServeHTTP up to the error routes.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		defer h.annotateSpan(span, repl) // see tracing.go
	}
	// A request that reached a sangho_dedup already (nested handlers: a
	// snippet imported at the site's level and in a handle, overlapping
	// matchers) is refused: this one would find the other's own lease
	// (409 for ever) or check its signature against other secrets.
	// The other one releases it (see neverForwarded).
	if outer, nested := caddyhttp.GetVar(r.Context(), servedVar).(string); nested {
		h.logger.Error("sangho_dedup twice on one request", zap.String("outer_name", outer),
			zap.String("fix", "let one sangho_dedup handle each request: not at the site's level and again in a handle or route, nor with overlapping matchers"))
		return caddyhttp.Error(http.StatusInternalServerError, errNested)
	}
	caddyhttp.SetVar(r.Context(), servedVar, h.Name)
	repl.Set("http.sangho_dedup.prior_attempt", "") // known, and empty unless marked

	// Only the handler says whether an earlier attempt's fate is unknown,
	// under any spelling a backend may read as its header: Go keeps
	// Sangho_Dedup_Prior_Attempt apart, CGI and FastCGI (php_fastcgi)
	// read both as HTTP_SANGHO_DEDUP_PRIOR_ATTEMPT.
	for k := range r.Header {
		if isPriorAttempt(k) {
			delete(r.Header, k)
		}
	}
	// Nor may a client name it in Connection: reverse_proxy deletes every
	// header that Connection names (hop-by-hop), the handler's mark too.
	if conn := r.Header.Values("Connection"); namesPriorAttempt(conn) {
		var keep []string
		for _, v := range conn {
			for tok := range strings.SplitSeq(v, ",") {
				if tok = strings.TrimSpace(tok); tok != "" && !isPriorAttempt(tok) {
					keep = append(keep, tok)
				}
			}
		}
		if len(keep) == 0 {
			r.Header.Del("Connection")
		} else {
			r.Header["Connection"] = []string{strings.Join(keep, ", ")}
		}
	}

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return h.reject(w, r, repl, outcomeBadRequest, http.StatusMethodNotAllowed, errMethod, "")
	}

	// The store stays open until this delivery is settled. It counts
	// from before the body is read: on a reload Caddy cleans the old
	// config up without waiting for its requests, and a store closed
	// while the body came in would fail the claim or, closed between
	// claim and commit, leave the event to be processed again after
	// lock_ttl (see dedup.UseCounter).
	h.enter()
	defer h.leave()

	body, status, err := h.readBody(r)
	if err != nil {
		oc := outcomeBadRequest
		if status == http.StatusRequestEntityTooLarge {
			oc = outcomeTooLarge
		}
		return h.reject(w, r, repl, oc, status, err, "")
	}
	defer body.done()

	vd, err := h.provider.Verify(r, body.bytes())
	if err != nil {
		return h.reject(w, r, repl, outcomeInvalidSignature, http.StatusUnauthorized, err, "")
	}

	// The body is read up to its event ID only, for now: see below.
	ev, err := h.eventOf(r, body.bytes(), &vd, true)
	if err != nil {
		return h.reject(w, r, repl, outcomeBadRequest, http.StatusBadRequest, err, "")
	}
	id := ev.id
	repl.Set("http.sangho_dedup.event_id", id)

	// dedup.Store operations run to completion even if the client goes away,
	// so that a claim that reached the store is always followed by a
	// commit or a release. go-redis's timeouts bound them.
	sctx := context.WithoutCancel(r.Context())
	start := time.Now()
	key := h.KeyPrefix + id
	fp := fingerprint(body.bytes())
	token := newToken() + "." + fp // the lease carries the body's fingerprint
	res, found, err := h.store.Claim(sctx, key, token, time.Duration(h.LockTTL))
	observe(opClaim, start, err)
	// The fingerprint in what the claim found (a record, a lease), if any.
	other := dedup.Fingerprint(found)
	// A duplicate of an event done with this very body (its fingerprint)
	// is answered without reading the rest of the body: that body was
	// read whole and found well-formed before it was processed. Every
	// other delivery is read whole now, before it goes anywhere (to the
	// backend, or to on_store_error pass) or is answered; one found
	// malformed is 400 as if read whole first, and its own new lease is
	// released. A lease it took over from an earlier attempt (Reclaimed)
	// is kept until lock_ttl: released, it would leave the next attempt
	// unmarked, though the earlier attempt's fate is still unknown.
	fastDup := ev.partial && err == nil && res == dedup.AlreadyDone && other == fp
	if ev.partial && !fastDup {
		whole, werr := h.readRest(body.bytes(), ev)
		if werr != nil {
			if err == nil && res == dedup.Claimed {
				h.releaseUnread(sctx, key, token, id, werr)
			}
			return h.reject(w, r, repl, outcomeBadRequest, http.StatusBadRequest, werr, id) // claimed under id
		}
		ev = whole
	}
	typ := cleanEventType(ev.typ)
	if fastDup && h.provider.typeHeader == "" {
		typ = cleanEventType(dedup.EventType(found)) // the body's, read when it was processed
	}
	repl.Set("http.sangho_dedup.event_type", typ)
	if err != nil {
		return h.storeFailed(w, r, next, repl, id, err)
	}
	// Every attempt of one event carries the same body: another body
	// under a known ID is a bug or an attack, never a duplicate.
	if res != dedup.Claimed {
		// The body's fingerprint in the format of the one found: a record
		// or lease of an older version holds its SHA-256 (fingerprintAs).
		if mine := fingerprintAs(other, fp, body.bytes()); mine != "" && mine != other {
			if res == dedup.InFlight || res == dedup.Reclaimed {
				state := "in_flight"
				if res == dedup.Reclaimed {
					state = "unknown"
				}
				h.logger.Warn("payload mismatch", zap.String("event_id", id), zap.String("state", state),
					zap.String("fingerprint", mine), zap.String("stored_fingerprint", other))
			} else {
				h.logger.Warn("payload mismatch", zap.String("event_id", id), zap.String("state", "done"),
					zap.String("fingerprint", mine), zap.String("stored_fingerprint", other),
					zap.String("on_payload_mismatch", h.OnPayloadMismatch))
				if h.OnPayloadMismatch != mismatchLog {
					w.Header().Set("Sangho-Dedup", "payload_mismatch")
					return h.reject(w, r, repl, outcomePayloadMismatch, http.StatusUnprocessableEntity, errPayloadMismatch, id)
				}
				h.outcome(repl, outcomePayloadMismatch)
				return h.answerDuplicate(w, r, body)
			}
		}
	}
	if res == dedup.AlreadyDone || res == dedup.InFlight {
		return h.answerTaken(w, r, repl, res, body, id, typ)
	}

	// Claimed or Reclaimed: from here on the delivery is one value,
	// settled once; a reclaimed one goes on marked, otherwise the same.
	d := &delivery{h: h, ctx: sctx, repl: repl, body: body, key: key, token: token, id: id, typ: typ, fingerprint: fp, claimed: start,
		marked: res == dedup.Reclaimed}
	if ev.fromHeader {
		// The ID is not signed: bind this signed message to its ID, so
		// that a replay under another ID is refused (see bindSignature).
		d.sigKey = signatureKey(h.KeyPrefix, vd.Before, body.bytes(), vd.After)
		if err := d.bindSignature(); err != nil {
			if processed := (*sigProcessedError)(nil); errors.As(err, &processed) {
				h.logger.Warn("signed message processed under another event ID", zap.String("event_id", id),
					zap.String("processed_as", processed.first), zap.Bool("prior_attempt_unknown", d.marked))
				h.outcome(repl, outcomeDuplicate)
				return h.answerDuplicate(w, r, body)
			}
			if errors.Is(err, errSigReplayed) {
				return h.reject(w, r, repl, outcomeInvalidSignature, http.StatusUnauthorized, err, id)
			}
			return h.storeFailed(w, r, next, repl, id, err)
		}
	}

	// A claim answered late (a lock wait, a stalled network or disk, a
	// signature binding after it) may have left a lease that ran out
	// before it was known here, and that another delivery took over
	// meanwhile, now at the backend. Claim again with the same token
	// before passing the event on, until a claim answers in time: the
	// token's own lease, run out or not, lives lock_ttl again; another's,
	// or a record, is answered as such. After lateClaims more claims
	// answered late, the store is failing: its error (the lease released
	// unless it is a mark's).
	for round := 0; time.Since(d.claimed) >= h.renewEvery; round++ {
		if round == lateClaims {
			if !d.marked {
				if _, rerr := d.release(sctx); rerr != nil {
					h.logger.Warn("release failed", zap.String("event_id", id), zap.Error(rerr))
				}
			}
			return h.storeFailed(w, r, next, repl, id, errClaimsLate)
		}
		again := time.Now()
		res, _, err := h.store.Claim(sctx, key, token, time.Duration(h.LockTTL))
		observe(opClaim, again, err)
		switch {
		case err != nil:
			return h.storeFailed(w, r, next, repl, id, err)
		case res == dedup.InFlight:
			h.logger.Warn("lease lost", zap.String("event_id", id), zap.String("during", "claim"),
				zap.Duration("claim_took", again.Sub(d.claimed)))
			metrics.leaseLost.Inc()
			return h.answerTaken(w, r, repl, res, body, id, typ)
		case res == dedup.AlreadyDone:
			return h.answerTaken(w, r, repl, res, body, id, typ)
		}
		d.claimed = again
		d.marked = d.marked || res == dedup.Reclaimed
	}

	if d.marked {
		markPriorAttempt(r, repl)
		h.logger.Warn("event passed on marked", zap.String("event_id", id), zap.String("event_type", typ),
			zap.String("prior_attempt", "unknown"))
	} else {
		h.debug("event passed on", id, typ)
	}
	return d.process(w, r, next)
}

// answerTaken answers a delivery whose claim found its event done (200,
// a duplicate) or in flight (409, with Retry-After).
func (h *Handler) answerTaken(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, res dedup.ClaimResult, body *pooledBody, id, typ string) error {
	if res == dedup.AlreadyDone {
		h.outcome(repl, outcomeDuplicate)
		h.debug("duplicate answered", id, typ)
		return h.answerDuplicate(w, r, body)
	}
	w.Header().Set("Retry-After", h.retryAfter)
	w.Header().Set("Sangho-Dedup", "in_flight")
	return h.reject(w, r, repl, outcomeInFlight, http.StatusConflict, errInFlight, id)
}

// releaseUnread releases the new lease of a delivery whose body, read
// whole after its claim, is malformed (see ServeHTTP).
func (h *Handler) releaseUnread(ctx context.Context, key, token, id string, cause error) {
	start := time.Now()
	_, err := h.store.Release(ctx, key, token)
	observe(opRelease, start, err)
	if err != nil {
		h.logger.Warn("release failed", zap.String("event_id", id), zap.NamedError("cause", cause),
			zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.Error(err))
	}
}

// answerDuplicate answers 200 {"received":true} with Sangho-Dedup:
// duplicate, without the backend.
func (h *Handler) answerDuplicate(w http.ResponseWriter, r *http.Request, body *pooledBody) error {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(duplicateBody)))
	hdr.Set("Sangho-Dedup", "duplicate")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(duplicateBody)
	// Nothing after us sees this request (no next handler, no error
	// route): the buffer can go back to the pool now. Whoever reads
	// the body anyway gets EOF, never another request's bytes.
	r.Body = http.NoBody
	body.Close()
	return nil
}

// storeFailed answers a delivery whose claim failed: 503, or with
// on_store_error pass, the next handler, unchecked.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, id string, err error) error {
	if h.pass {
		h.outcome(repl, outcomeUnchecked)
		markPriorAttempt(r, repl) // nothing vouches that it is the first attempt
		h.logger.Warn("store failed", zap.String("event_id", id), zap.String("on_store_error", h.OnStoreError), zap.Error(err))
		return next.ServeHTTP(w, r)
	}
	h.logger.Error("store failed", zap.String("event_id", id), zap.String("on_store_error", h.OnStoreError), zap.Error(err))
	w.Header().Set("Retry-After", h.retryAfter)
	return h.reject(w, r, repl, outcomeStoreError, http.StatusServiceUnavailable, errStore, id)
}

// reject answers a request that is not passed on. Where the server has
// error routes (handle_errors), as a Caddy error that they can shape.
// Elsewhere it writes the status itself, as Caddy would (an empty body):
// Caddy's error log line for a returned error carries the request's
// headers, the signature among them (Caddy redacts only Authorization
// and cookies), and this handler logs the rejection itself, with no
// header.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, outcome string, status int, err error, id string) error {
	h.outcome(repl, outcome)
	// As Caddy's access log names the client: the address alone, then
	// the port (none for a Unix socket).
	remote := func() (string, string) {
		ip, port, splitErr := net.SplitHostPort(r.RemoteAddr)
		if splitErr != nil {
			return r.RemoteAddr, ""
		}
		return ip, port
	}
	if outcome == outcomeInvalidSignature {
		reason := sigFailureReason(err)
		metrics.sigReason[reason].Inc()
		if h.sigRejects != nil {
			ip, _ := remote()
			h.sigRejects.note(zap.String("reason", reason), zap.String("remote_ip", ip), zap.Error(err))
		}
	}
	if ce := h.logger.Check(zapcore.DebugLevel, "delivery rejected"); ce != nil {
		ip, port := remote()
		ce.Write(zap.String("outcome", outcome), zap.Int("status", status), zap.String("event_id", id),
			zap.String("remote_ip", ip), zap.String("remote_port", port), zap.Error(err))
	}
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && (srv.Errors == nil || len(srv.Errors.Routes) == 0) {
		w.WriteHeader(status)
		return nil
	}
	return caddyhttp.Error(status, err)
}

func (h *Handler) outcome(repl *caddy.Replacer, outcome string) {
	repl.Set("http.sangho_dedup.outcome", outcome)
	h.outcomes[outcome].Inc()
}

func (h *Handler) debug(msg, id, typ string) {
	if ce := h.logger.Check(zapcore.DebugLevel, msg); ce != nil {
		ce.Write(zap.String("event_id", id), zap.String("event_type", typ))
	}
}
