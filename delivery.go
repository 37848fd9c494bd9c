package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// delivery is one delivery past its claim: which event it is, the lease
// it holds on it, and what the next handler answered. It is settled once:
// committed, released or held (see settle).
type delivery struct {
	h    *Handler
	ctx  context.Context // the request's, detached from the client: store operations run to completion
	repl *caddy.Replacer
	body *pooledBody // what the next handler reads (see sentEarlier)

	key         string          // the event's store key, key_prefix + id
	token       string          // the lease token: unique, then "." and the fingerprint
	id, typ     string          // the event ID and type
	fingerprint string          // of the body (see fingerprint)
	claimed     time.Time       // when the claim was sent: the lease runs from then
	reqCtx      context.Context // the request's own: canceled when the client goes away
	sigKey      string          // the signature record, when the ID is not signed (see bindSignature)
	marked      bool            // reclaimed: passed on with Sangho-Dedup-Prior-Attempt: unknown

	lease lease        // renewed while the next handler runs
	sw    statusWriter // records the status line the next handler wrote
	// goneAtStatus: the client was gone when the status line was
	// written (see statusKnown).
	goneAtStatus atomic.Bool
}

// process runs the next handler while holding the lease, then settles
// the event: commit, release or hold (see settle).
func (d *delivery) process(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()
	d.reqCtx = r.Context()
	d.startLease()
	d.sw.ResponseWriter, d.sw.d = w, d
	defer setAsideProxyStatus(d.repl)() // put back once settled
	finished := false
	defer func() {
		if finished {
			return
		}
		// The next handler panicked: settle the event (a panic is an
		// unknown fate), then let the panic go on to Caddy's recovery.
		d.lease.stop()
		d.settle(errPanic)
	}()
	err := next.ServeHTTP(&d.sw, r)
	finished = true
	if err == nil && d.sw.status.Load() == 0 && unhandled(r) && !proxied(d.repl) {
		// Caddy's chain ended after this handler without an answer: no
		// handler processed the event (Caddy would answer 200, empty).
		d.h.logger.Error("no handler after sangho_dedup", zap.String("event_id", d.id),
			zap.String("fix", "put the backend's handler (reverse_proxy, php_fastcgi, ...) after sangho_dedup in the same route; a Caddyfile named route &(name) keeps only its first directive: wrap them in route { }"))
		err = caddyhttp.Error(http.StatusInternalServerError, errNothingAfter)
	}
	d.lease.stop()
	d.settle(err)
	return err
}

// errNothingAfter is the error of a delivery that no handler after
// sangho_dedup answered (see unhandled): released, answered 500.
var errNothingAfter = errors.New("no handler after sangho_dedup answered the delivery")

// unhandled reports whether Caddy's handler chain ran to its end for r:
// its last, implicit handler sets the variable "unhandled".
func unhandled(r *http.Request) bool {
	v, _ := caddyhttp.GetVar(r.Context(), "unhandled").(bool)
	return v
}

// proxied reports whether a reverse_proxy (php_fastcgi is one) after
// this handler got an upstream's answer for this request: its
// handle_response routes run with the handlers after it as their next,
// and routes that write nothing reach the chain's end too, after the
// backend answered. (One before sangho_dedup, forward_auth say, is set
// aside while the next handler runs: setAsideProxyStatus.)
func proxied(repl *caddy.Replacer) bool { return upstreamStatus(repl) != 0 }

// upstreamStatus is the status of the upstream's answer that a
// reverse_proxy after this handler got, 0 if none (see
// setAsideProxyStatus).
func upstreamStatus(repl *caddy.Replacer) int {
	v, _ := repl.Get(proxyStatusVar)
	n, _ := v.(int)
	return n
}

// proxyStatusVar is the variable reverse_proxy sets to its upstream's
// status.
const proxyStatusVar = "http.reverse_proxy.status_code"

// setAsideProxyStatus removes the status a reverse_proxy before this
// handler (forward_auth, say) set, which proxied would read as the next
// handlers', and returns the function that puts it back unless a handler
// after this one set it again (for the access log and the error routes).
// Without it, a route with nothing after sangho_dedup behind forward_auth
// was taken for a processed event: the event lost.
func setAsideProxyStatus(repl *caddy.Replacer) (restore func()) {
	status, had := repl.Get(proxyStatusVar)
	if !had {
		return func() {}
	}
	repl.Delete(proxyStatusVar)
	return func() {
		if _, set := repl.Get(proxyStatusVar); !set {
			repl.Set(proxyStatusVar, status)
		}
	}
}

var errPanic = errors.New("the next handler panicked")

// statusClientClosedRequest is the status reverse_proxy writes when the
// client goes away mid-request (nginx's 499).
const statusClientClosedRequest = 499

// errClientGone is the cause logged for a 499 written because the
// client went away (see judge).
var errClientGone = errors.New("the client went away mid-request (status 499)")

// errGatewayStatus is the cause logged for a 502 or 504 held (see
// judge); errRetriedAfterSent for a non-2xx answer held because an
// earlier attempt may have reached a backend.
var (
	errGatewayStatus    = errors.New("a gateway's answer (502 or 504): the application behind it may have done the work, or may still be doing it")
	errRetriedAfterSent = errors.New("reverse_proxy retried after an earlier attempt that may have reached a backend: the last attempt's answer tells nothing of that one")
)

// errKeptMarked is the cause of a marked delivery held, not released,
// though it was not processed (see settle, bindSignature).
var errKeptMarked = errors.New("a marked delivery (the earlier attempt's fate still unknown) not processed: its lease is kept until lock_ttl, so that the next delivery is marked too")

// verdict is how a delivery that reached the next handler ends.
type verdict int

const (
	toCommit  verdict = iota // the backend answered 2xx: processed
	toRelease                // the backend answered non-2xx, or was never reached: retry now
	toHold                   // unknown whether the backend got it: let the lease expire
)

// judge decides from the status line the next handler wrote and the
// error it returned.
//
// The status line is the verdict: once the backend has said 2xx it has
// done the work, even if the body is cut short later (client gone), so
// the event must not be processed again; a handler that returned nil
// without writing anything answers 200 (net/http's default). A non-2xx
// status is the backend saying it failed: release. Except 502 and 504:
// the answers of a gateway between Caddy and the application (nginx, an
// ingress, a cloud load balancer) when the application's connection
// broke or its answer came too late, after it may have done the work;
// and any status of an attempt that reverse_proxy made after an earlier
// one that may have reached a backend (sentEarlier). An error without any
// status tells nothing of the backend, except when the request provably
// never left Caddy (a dial error, no upstream available): release.
// Otherwise — a timeout, a connection lost mid-request, the client gone
// while the backend worked, a panic — the backend may still be working
// on the event or may have finished it, and releasing would let Sangho's
// next attempt run concurrently or twice: hold the lease until it
// expires (lock_ttl), so the retry is processed after that.
//
// 499 with the request's context canceled (clientGone) is such an
// unknown outcome, not the backend's answer: Caddy's reverse_proxy
// writes 499 itself, and returns no error, when the client goes away
// mid-request, while the backend may go on to finish the work.
//
// A dial error tells of the last attempt only: when reverse_proxy
// retried, an earlier attempt may have reached a backend (sentEarlier),
// and the event is held.
func judge(status int, err error, clientGone, sentEarlier bool) verdict {
	switch {
	case status == 0 && err == nil:
		return toCommit
	case status >= 200 && status <= 299:
		return toCommit
	case status == statusClientClosedRequest && clientGone:
		return toHold
	case gatewayStatus(status):
		return toHold
	case status != 0 && sentEarlier:
		return toHold
	case status != 0:
		return toRelease
	case neverForwarded(err) && !sentEarlier:
		return toRelease
	}
	return toHold
}

// gatewayStatus reports whether status is one a gateway between Caddy
// and the application answers when the application's connection broke
// or its answer came late (see judge).
func gatewayStatus(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusGatewayTimeout
}

// sentEarlier reports whether an attempt before the next handler's last
// may have reached a backend: reverse_proxy retried
// ({http.reverse_proxy.retries}), and the body was read, which no
// attempt whose dial failed does, or is empty (reverse_proxy sends a
// request of Content-Length 0 without reading its body). (With
// reverse_proxy's request_buffers the body is read before the first
// dial: its retries are held.) Retries of a POST happen after dial
// errors, and, with lb_retry_match that matches it, after any error, a
// request sent and lost included.
func (d *delivery) sentEarlier() bool {
	n, _ := d.repl.Get("http.reverse_proxy.retries")
	retries, _ := n.(int)
	return retries > 0 && d.body != nil && (d.body.read.Load() || len(d.body.bytes()) == 0)
}

// neverForwarded reports whether err shows that the request did not
// reach the backend: reverse_proxy's (and php_fastcgi's) dial errors, its
// "no upstreams available", and no handler after this one at all.
func neverForwarded(err error) bool {
	if errors.Is(err, errNothingAfter) || errors.Is(err, errNested) {
		return true
	}
	var de reverseproxy.DialError
	if errors.As(err, &de) {
		return true
	}
	var he caddyhttp.HandlerError
	return errors.As(err, &he) && he.StatusCode == http.StatusServiceUnavailable &&
		he.Err != nil && he.Err.Error() == "no upstreams available"
}

// settle commits, releases or holds the event, given the error the next
// handler returned and the status it wrote (see judge).
func (d *delivery) settle(err error) {
	h := d.h
	status := int(d.sw.status.Load())
	gone := errors.Is(d.reqCtx.Err(), context.Canceled)
	if status != 0 {
		gone = d.goneAtStatus.Load() // as the status line was judged (statusKnown)
	}
	v, keptMarked, upstream := d.verdictOf(status, err, gone, d.sentEarlier())
	switch {
	case upstream != nil && err != nil:
		err = fmt.Errorf("%w: %w", upstream, err)
	case upstream != nil:
		err = upstream
	case v == toHold && !keptMarked && err == nil:
		switch {
		case status == statusClientClosedRequest && gone:
			err = errClientGone
		case gatewayStatus(status):
			err = errGatewayStatus
		case status != 0:
			err = errRetriedAfterSent
		}
	}
	if keptMarked {
		if err == nil {
			err = fmt.Errorf("%w: the backend answered %d", errKeptMarked, status)
		} else {
			err = fmt.Errorf("%w: %w", errKeptMarked, err)
		}
	}
	switch v {
	case toCommit:
		h.outcome(d.repl, d.outcomeOf(v))
		rec := dedup.DoneRecord{ProcessedAt: h.now(), EventType: d.typ, Fingerprint: d.fingerprint}
		// Registered before the first try, so that a forget meanwhile
		// waits for it and stops what follows (see Handler.forget).
		cr := commitRetries.add(h.storeData, d.key)
		var held bool
		stopped, cerr := cr.attempt(func() (err error) {
			held, err = d.commitAll(d.ctx, rec)
			return err
		})
		if stopped || cerr == nil {
			commitRetries.remove(cr) // nothing left to retry
		}
		switch {
		case stopped:
			h.logger.Info("commit stopped", zap.String("event_id", d.id), zap.String("cause", "event forgotten"))
		case cerr != nil:
			h.logger.Warn("commit failed", zap.String("event_id", d.id), zap.Int("status", status), zap.Error(cerr))
			h.enter()
			pendingCommits.add(h.logger, 1)
			go func() {
				defer h.leave()
				defer pendingCommits.add(h.logger, -1)
				defer commitRetries.remove(cr)
				d.retryCommit(rec, cr)
			}()
		case !held:
			metrics.leaseLost.Inc()
			h.logger.Warn("lease lost", zap.String("event_id", d.id), zap.String("during", "commit"), zap.Int("status", status))
		default:
			h.debug("event processed", d.id, d.typ)
		}
	case toRelease:
		released, rerr := d.release(d.ctx)
		h.outcome(d.repl, d.outcomeOf(v))
		spanEvent(d.ctx, spanEventReleased, status, err, 0)
		switch {
		case rerr != nil:
			h.logger.Error("release failed", zap.String("event_id", d.id), zap.Int("status", status),
				zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.Error(rerr))
		case !released:
			metrics.leaseLost.Inc()
			h.logger.Warn("lease lost", zap.String("event_id", d.id), zap.String("during", "release"), zap.Int("status", status))
		default:
			h.logger.Info("event released", zap.String("event_id", d.id), zap.Int("status", status), zap.NamedError("cause", err))
		}
	case toHold:
		h.outcome(d.repl, d.outcomeOf(v))
		spanEvent(d.ctx, spanEventHeld, status, err, time.Duration(h.LockTTL))
		fields := []zap.Field{zap.String("event_id", d.id), zap.Int("status", status), zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.NamedError("cause", err)}
		if u := upstreamStatus(d.repl); u != 0 && u != status {
			fields = append(fields, zap.Int("upstream_status", u)) // rewritten on its way out (see verdictOf)
		}
		h.logger.Warn("event held", fields...)
	}
}

// verdictOf is judge's verdict for this delivery: a marked delivery that
// the backend did not take is held, not released (keptMarked): the
// earlier attempt's fate is still unknown (the backend may have failed
// before it checked its records). Released, the next delivery would go
// on unmarked; held, the lease lapses into a mark again at lock_ttl,
// and the next delivery after it is marked.
//
// A release is held instead when the status variable of the last
// reverse_proxy says the answer may not be the backend's own word
// (upstream, the cause).
func (d *delivery) verdictOf(status int, err error, clientGone, sentEarlier bool) (v verdict, keptMarked bool, upstream error) {
	v = judge(status, err, clientGone, sentEarlier)
	if v == toRelease && errors.Is(err, errNested) && (proxied(d.repl) || d.body != nil && d.body.read.Load()) {
		// The second sangho_dedup came after a proxy had sent the
		// delivery on (in handle_response, say): not never forwarded.
		return toHold, false, errNestedAfterSent
	}
	if v == toRelease {
		if upstream = d.upstreamHold(status); upstream != nil {
			return toHold, false, upstream
		}
	}
	if v == toRelease && d.marked {
		return toHold, true, nil
	}
	return v, false, nil
}

// errNestedAfterSent is the cause of a delivery held because a second
// sangho_dedup refused it after a proxy had sent it on (see verdictOf).
var errNestedAfterSent = errors.New("a second sangho_dedup refused the request after a reverse_proxy had sent it on: the backend may have done the work")

// errRewrittenStatus is the cause of a non-2xx answer held because it
// is not the last upstream's status (see upstreamHold).
var errRewrittenStatus = errors.New("the status written is not the last upstream's (intercept, replace_status or handle_response rewrote it, or the page came from another proxy): the backend's own answer is unknown")

// upstreamHold tells why a delivery that judge releases is held for the
// status variable of the last reverse_proxy (setAsideProxyStatus), or
// nil: a gateway's 502 or 504; or a non-2xx status written that is not
// that variable's, which a handler between this one and the proxy
// (intercept, the proxy's replace_status or handle_response) wrote in
// place of the upstream's answer. The variable is the last upstream's,
// maybe another proxy's than the backend's (an error page, forward_auth),
// so it can only make the handler hold more: its 2xx proves nothing.
func (d *delivery) upstreamHold(status int) error {
	u := upstreamStatus(d.repl)
	switch {
	case gatewayStatus(u):
		return errGatewayStatus
	case status != 0 && u != 0 && u != status:
		return errRewrittenStatus
	}
	return nil
}

// outcomeOf names the outcome of verdict v.
func (d *delivery) outcomeOf(v verdict) string {
	switch {
	case v == toCommit && d.marked:
		return outcomeProcessedMarked
	case v == toCommit:
		return outcomeProcessed
	case v == toRelease:
		return outcomeReleased
	}
	return outcomeHeld
}

// statusKnown sets the outcome placeholder when the next handler writes
// its status line, before the line goes out through the handlers around
// this one (a deferred header): the status decides the verdict (judge),
// the error the next handler returns later changes nothing once a
// status is written, and settle sets the same outcome again when it
// counts it.
func (d *delivery) statusKnown(status int) {
	// Whether the client was gone tells Caddy's 499 from the backend's;
	// a client that leaves after the line does not change what it was.
	gone := errors.Is(d.reqCtx.Err(), context.Canceled)
	d.goneAtStatus.Store(gone)
	v, _, _ := d.verdictOf(status, nil, gone, false)
	d.repl.Set("http.sangho_dedup.outcome", d.outcomeOf(v))
}

// commit turns the lease into the done record rec.
func (d *delivery) commit(ctx context.Context, rec dedup.DoneRecord) (bool, error) {
	start := time.Now()
	held, err := d.h.store.Commit(ctx, d.key, d.token, rec, time.Duration(d.h.Retention))
	observe(opCommit, start, err)
	return held, err
}

// commitAll commits, and then writes the signature record when the ID
// is not signed (see bindSignature).
func (d *delivery) commitAll(ctx context.Context, rec dedup.DoneRecord) (bool, error) {
	held, err := d.commit(ctx, rec)
	if err == nil && d.sigKey != "" {
		d.commitSignature(ctx, rec)
	}
	return held, err
}

// release deletes the lease, so that the next delivery of the event is
// processed.
func (d *delivery) release(ctx context.Context) (bool, error) {
	start := time.Now()
	released, err := d.h.store.Release(ctx, d.key, d.token)
	observe(opRelease, start, err)
	return released, err
}

// statusWriter records the final (non-1xx) status line the next handler
// writes. Flush, Hijack and the like reach the real writer through
// Unwrap (http.ResponseController).
type statusWriter struct {
	caddyhttp.ResponseWriterWrapper // by value: one allocation for both
	status                          atomic.Int32
	d                               *delivery // told the status first written (statusKnown)
}

// first records the status line the next handler writes first.
func (sw *statusWriter) first(code int) {
	if sw.status.CompareAndSwap(0, int32(code)) && sw.d != nil {
		sw.d.statusKnown(code)
	}
}

func (sw *statusWriter) WriteHeader(code int) {
	if code >= 200 {
		sw.first(code)
	}
	sw.ResponseWriterWrapper.WriteHeader(code)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	sw.first(http.StatusOK)
	return sw.ResponseWriterWrapper.Write(b)
}

func (sw *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	sw.first(http.StatusOK)
	return io.Copy(&sw.ResponseWriterWrapper, r)
}

// errSigReplayed refuses a signed message already accepted with another
// event ID (see bindSignature).
var errSigReplayed = errors.New("this signature was already accepted with another event ID (replay through the unsigned event ID header)")

// sigProcessedError answers a signed message already processed under
// another event ID (see bindSignature): the same signed bytes, so a
// duplicate of that event, answered as one.
type sigProcessedError struct{ first string }

func (e *sigProcessedError) Error() string {
	return "this signed message was processed under another event ID"
}

// signatureKey names the store record of a signed message: the SHA-256
// of what the signature covers (for Sangho t + "." + body, for GitHub
// the body), so that it does not depend on which secret or which
// signature matched. The ":" keeps it apart from event keys (an event ID
// has none).
func signatureKey(prefix string, before, body, after []byte) string {
	hash := sha256.New()
	hash.Write(before)
	hash.Write(body)
	hash.Write(after)
	var sum [sha256.Size]byte
	return prefix + "sig:" + hex.EncodeToString(hash.Sum(sum[:0]))
}

// bindSignature binds a signed message to the event ID it came with,
// when the signature does not cover the ID, so that a captured delivery
// replayed under another ID is refused (errSigReplayed, 401) instead of
// processed as a new event. It runs once this delivery holds the lease
// on its own event key, so a resent delivery of a processed event is a
// duplicate before it gets here. The record, key_prefix + "sig:" +
// SHA-256 of the signed message, is claimed as a lease whose token is
// the event ID: the same ID claims it again (a retry after a failure),
// another does not. It lives sigMemory: while the signature is valid
// (2×tolerance+1s), or retention when the provider signs no timestamp, and
// it becomes a durable done record when the event is processed (see
// commitSignature). On a refusal or a store error the event's own lease
// is released before returning, or, if it took over a mark, kept until
// lock_ttl, as settle does.
func (d *delivery) bindSignature() error {
	h := d.h
	start := time.Now()
	res, found, err := h.store.Claim(d.ctx, d.sigKey, d.id, h.sigMemory)
	observe(opClaim, start, err)
	// Reclaimed: the binding's time (sigMemory) ran out without a commit,
	// and the store keeps it as a mark; a binding lasts sigMemory, no
	// more, so the message is bound to this ID now.
	if err == nil && (res == dedup.Claimed || res == dedup.Reclaimed) {
		return nil
	}
	// A done record of this same ID: the event was processed, then
	// forgotten by an operator (GitHub's manual redelivery reuses the
	// delivery ID), and is let through again. Of another ID and of this
	// delivery's type: these signed bytes were processed under it (a
	// replay, or a second event with a byte-identical body, which Shopify
	// sends), a duplicate. Of another type (which the sender may not sign:
	// Shopify's topic header), another event: refused, as a replay.
	if rec, ok := dedup.DecodeDone(found); err == nil && res == dedup.AlreadyDone && ok {
		switch first := replayRecordOf(rec); {
		case first == d.id:
			return nil
		case rec.EventID != "" && rec.EventType == d.typ:
			err = &sigProcessedError{first: first}
		}
	}
	if err == nil {
		err = errSigReplayed
	}
	if d.marked {
		h.logger.Warn("event held", zap.String("event_id", d.id), zap.Duration("lock_ttl", time.Duration(h.LockTTL)),
			zap.NamedError("cause", fmt.Errorf("%w: %w", errKeptMarked, err)))
		return err
	}
	if _, rerr := d.release(d.ctx); rerr != nil {
		h.logger.Warn("release failed", zap.String("event_id", d.id), zap.NamedError("cause", err),
			zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.Error(rerr))
	}
	return err
}

// commitSignature turns the signature record of a processed event into
// a done record, owned by the event ID, for sigMemory. A failure leaves
// the lease, which keeps refusing replays until it expires, and is
// logged.
func (d *delivery) commitSignature(ctx context.Context, rec dedup.DoneRecord) {
	// The record names the event ID that owns the signature.
	rec.EventID = d.id
	start := time.Now()
	_, err := d.h.store.Commit(ctx, d.sigKey, d.id, rec, d.h.sigMemory)
	observe(opCommit, start, err)
	if err != nil {
		d.h.logger.Warn("signature record commit failed", zap.String("event_id", d.id), zap.Error(err))
	}
}

// replayRecordOf is the event ID a signature's replay record names:
// its event_id, or, in a record written before v0.3, its event_type
// (which held the ID there).
func replayRecordOf(rec dedup.DoneRecord) string {
	if rec.EventID != "" {
		return rec.EventID
	}
	return rec.EventType
}
