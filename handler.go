package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

var (
	errMethod   = errors.New("method not allowed: Sangho delivers webhooks with POST")
	errInFlight = errors.New("another delivery of this event is being processed")
	errStore    = errors.New("dedup store unavailable")
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

// markPriorAttempt marks a delivery about to be passed on (see
// headerPriorAttempt) and sets {http.sangho_dedup.prior_attempt}.
func markPriorAttempt(r *http.Request, repl *caddy.Replacer) {
	r.Header.Set(headerPriorAttempt, "unknown")
	repl.Set("http.sangho_dedup.prior_attempt", "unknown")
}

// ServeHTTP verifies, deduplicates and passes on one delivery.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		defer h.annotateSpan(span, repl) // see tracing.go
	}

	// Only the handler says whether an earlier attempt's fate is unknown.
	delete(r.Header, headerPriorAttempt)

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return h.reject(w, r, repl, outcomeBadRequest, http.StatusMethodNotAllowed, errMethod, "")
	}

	// The store stays open until this delivery is settled. It counts
	// from before the body is read: on a reload Caddy cleans the old
	// config up without waiting for its requests, and a store closed
	// while the body came in would fail the claim or, closed between
	// claim and commit, leave the event to be processed again after
	// lock_ttl (see dedup.Drainer).
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

	ev, err := h.eventOf(r, body.bytes(), &vd)
	if err != nil {
		return h.reject(w, r, repl, outcomeBadRequest, http.StatusBadRequest, err, "")
	}
	id, typ := ev.id, ev.typ
	repl.Set("http.sangho_dedup.event_id", id)
	repl.Set("http.sangho_dedup.event_type", typ)

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
	if err != nil {
		return h.storeFailed(w, r, next, repl, id, err)
	}
	// Every attempt of one event carries the same body: another body
	// under a known ID is a bug or an attack, never a duplicate.
	if res != dedup.Claimed {
		// The body's fingerprint in the format of the one found: a record
		// or lease of an older version holds its SHA-256 (fingerprintAs).
		other := dedup.Fingerprint(found)
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
	switch res {
	case dedup.AlreadyDone:
		h.outcome(repl, outcomeDuplicate)
		h.debug("duplicate answered", id, typ)
		return h.answerDuplicate(w, r, body)
	case dedup.InFlight:
		w.Header().Set("Retry-After", h.retryAfter)
		w.Header().Set("Sangho-Dedup", "in_flight")
		return h.reject(w, r, repl, outcomeInFlight, http.StatusConflict, errInFlight, id)
	}

	// Claimed or Reclaimed: from here on the delivery is one value,
	// settled once; a reclaimed one goes on marked, otherwise the same.
	d := &delivery{h: h, ctx: sctx, repl: repl, key: key, token: token, id: id, typ: typ, fingerprint: fp, claimed: start,
		marked: res == dedup.Reclaimed}
	if ev.fromHeader {
		// The ID is not signed: bind this signed message to its ID, so
		// that a replay under another ID is refused (see bindSignature).
		d.sigKey = signatureKey(h.KeyPrefix, vd.Before, body.bytes(), vd.After)
		if err := d.bindSignature(); err != nil {
			if errors.Is(err, errSigReplayed) {
				return h.reject(w, r, repl, outcomeInvalidSignature, http.StatusUnauthorized, err, id)
			}
			return h.storeFailed(w, r, next, repl, id, err)
		}
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

// fingerprint is the body's fingerprint as this version writes it: "x"
// and the hex of the body's xxh64 (17 characters). It only has to tell
// one body from another under one event ID, of bodies already
// authenticated by the sender's signature; docs/how-it-works.md says
// why 64 bits of a non-cryptographic hash are enough for that. It costs
// a small part of the SHA-256 that older versions computed
// (BenchmarkServeBodies).
func fingerprint(body []byte) string {
	var b [1 + 2*8]byte
	b[0] = 'x'
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], xxhash.Sum64(body))
	hex.Encode(b[1:], sum[:])
	return string(b[:])
}

// sha256Fingerprint is the fingerprint older versions wrote: the hex of
// the first 16 bytes of the body's SHA-256 (32 characters).
func sha256Fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// fingerprintAs returns body's fingerprint in the format of stored, a
// fingerprint found in the store, to compare with it: fp (body's own,
// see fingerprint) when stored is of this version's format; the
// SHA-256 fingerprint, computed only then, when stored was written by
// an older version (records stay for the retention, and a lease may be
// held by an older instance on a shared store); "" when stored is of a
// format this version does not know (written by a newer version): it
// says nothing, as a record written before fingerprints existed.
func fingerprintAs(stored, fp string, body []byte) string {
	switch {
	case len(stored) == len(fp) && stored[0] == fp[0]:
		return fp
	case len(stored) == 32 && isLowerHex(stored):
		return sha256Fingerprint(body)
	}
	return ""
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
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

// delivery is one delivery past its claim: which event it is, the lease
// it holds on it, and what the next handler answered. It is settled once:
// committed, released or held (see settle).
type delivery struct {
	h    *Handler
	ctx  context.Context // the request's, detached from the client: store operations run to completion
	repl *caddy.Replacer

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
}

// process runs the next handler while holding the lease, then settles
// the event: commit, release or hold (see settle).
func (d *delivery) process(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()
	d.reqCtx = r.Context()
	d.startLease()
	d.sw.ResponseWriter = w
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
	d.lease.stop()
	d.settle(err)
	return err
}

var errPanic = errors.New("the next handler panicked")

// statusClientClosedRequest is the status reverse_proxy writes when the
// client goes away mid-request (nginx's 499).
const statusClientClosedRequest = 499

// errClientGone is the cause logged for a 499 written because the
// client went away (see judge).
var errClientGone = errors.New("the client went away mid-request (status 499)")

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
// status is the backend saying it failed: release. An error without any
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
func judge(status int, err error, clientGone bool) verdict {
	switch {
	case status == 0 && err == nil:
		return toCommit
	case status >= 200 && status <= 299:
		return toCommit
	case status == statusClientClosedRequest && clientGone:
		return toHold
	case status != 0:
		return toRelease
	case neverForwarded(err):
		return toRelease
	}
	return toHold
}

// neverForwarded reports whether err shows that the request did not
// reach the backend: reverse_proxy's (and php_fastcgi's) dial errors and
// its "no upstreams available".
func neverForwarded(err error) bool {
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
	v := judge(status, err, gone)
	if v == toHold && err == nil && status == statusClientClosedRequest {
		err = errClientGone
	}
	switch v {
	case toCommit:
		if d.marked {
			h.outcome(d.repl, outcomeProcessedMarked)
		} else {
			h.outcome(d.repl, outcomeProcessed)
		}
		rec := dedup.DoneRecord{ProcessedAt: h.now(), EventType: d.typ, Fingerprint: d.fingerprint}
		// Registered before the first try, so that a forget meanwhile
		// waits for it and stops what follows (see Handler.forget).
		cr := commitRetries.add(h.storeState, d.key)
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
		h.outcome(d.repl, outcomeReleased)
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
		h.outcome(d.repl, outcomeHeld)
		spanEvent(d.ctx, spanEventHeld, status, err, time.Duration(h.LockTTL))
		h.logger.Warn("event held", zap.String("event_id", d.id), zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.NamedError("cause", err))
	}
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

// retryCommit keeps trying to write the done record of an event the
// backend processed. Writing it late is always right: the event was
// processed, and if another delivery claimed it meanwhile (our lease
// expired during a long store outage), that delivery's own commit writes
// the same fact and its release cannot delete a done record. Retries are
// frequent (at most every 250 ms) so that the record lands soon after
// the store is back, before Sangho's next redelivery, and they stop
// after dedup.CommitRetryFor. A record written after the lease expired, or
// never, is logged at error level; never is counted in
// caddy_sangho_dedup_commit_errors_total. An operator's forget of the
// event stops them (see Handler.forget): the record is not written back.
func (d *delivery) retryCommit(rec dedup.DoneRecord, cr *commitRetry) {
	h := d.h
	deadline := time.Now().Add(dedup.CommitRetryFor)
	backoff := 50 * time.Millisecond
	for tries := 1; time.Now().Before(deadline); tries++ {
		time.Sleep(backoff)
		backoff = min(2*backoff, 250*time.Millisecond)
		stopped, err := cr.attempt(func() error {
			ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
			defer cancel()
			_, err := d.commitAll(ctx, rec)
			return err
		})
		if stopped {
			h.logger.Info("commit stopped", zap.String("event_id", d.id), zap.String("cause", "event forgotten"))
			return
		}
		if err != nil {
			continue
		}
		if time.Now().After(d.lease.expiry()) {
			h.logger.Error("commit retried after lease expired", zap.String("event_id", d.id), zap.Int("retries", tries))
		} else {
			h.logger.Info("commit retried", zap.String("event_id", d.id), zap.Int("retries", tries))
		}
		return
	}
	metrics.commitErr.Inc()
	h.logger.Error("commit abandoned", zap.String("event_id", d.id), zap.Duration("tried_for", dedup.CommitRetryFor))
}

// commitRetries are the commits of this process, under way or retried
// in the background, by the store state and key they write: a forget
// of the event stops them, or one would write the forgotten record back.
var commitRetries = retryRegistry{m: map[retryKey]*commitRetry{}}

type retryRegistry struct {
	mu sync.Mutex
	m  map[retryKey]*commitRetry // the first of a chain (next)
}

type retryKey struct{ state, key string }

// commitRetry is one event's commit and its background retries.
type commitRetry struct {
	rk      retryKey
	next    *commitRetry // another commit of the same key (rare)
	mu      sync.Mutex   // held during an attempt, and by a forget
	stopped bool
}

func (r *retryRegistry) add(state, key string) *commitRetry {
	cr := &commitRetry{rk: retryKey{state, key}}
	r.mu.Lock()
	cr.next = r.m[cr.rk]
	r.m[cr.rk] = cr
	r.mu.Unlock()
	return cr
}

func (r *retryRegistry) remove(cr *commitRetry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if first := r.m[cr.rk]; first == cr {
		if cr.next == nil {
			delete(r.m, cr.rk)
		} else {
			r.m[cr.rk] = cr.next
		}
	} else {
		for c := first; c != nil; c = c.next {
			if c.next == cr {
				c.next = cr.next
				break
			}
		}
	}
}

// pending reports whether a commit of key in state is registered.
func (r *retryRegistry) pending(state, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[retryKey{state, key}] != nil
}

// hold waits for the attempts in flight of the commits of key in state
// and keeps new ones from starting until the returned function is
// called with whether they are to stop.
func (r *retryRegistry) hold(state, key string) func(stop bool) {
	var list []*commitRetry
	r.mu.Lock()
	for c := r.m[retryKey{state, key}]; c != nil; c = c.next {
		list = append(list, c)
	}
	r.mu.Unlock()
	for _, cr := range list {
		cr.mu.Lock()
	}
	return func(stop bool) {
		for _, cr := range list {
			cr.stopped = cr.stopped || stop
			cr.mu.Unlock()
		}
	}
}

// attempt runs one try unless the retry was stopped.
func (cr *commitRetry) attempt(try func() error) (stopped bool, err error) {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.stopped {
		return true, nil
	}
	return false, try()
}

// forget is the operators' forget (admin API) of key: it deletes the
// event's record (with force, its lease too) and stops this process's
// background commit retries of it, which would write the record back.
// They are held while the store forgets, and go on if nothing was
// forgotten because the event is in flight.
func (h *Handler) forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	release := commitRetries.hold(h.storeState, key)
	e, deleted, err := h.store.Forget(ctx, key, force)
	release(err == nil && (deleted || e.Value == ""))
	return e, deleted, err
}

// Background commit retries live as long as the store they need (a
// reload keeps it open for them, see poolUsers), at most dedup.CommitRetryFor.
// When the process exits they get exitCommitGrace more to land; those
// still failing then are abandoned, logged and counted.
var (
	pendingCommits  = pendingSet{m: map[*zap.Logger]int64{}} // background commit retries of this process
	exitCommitGrace = 5 * time.Second
	onExitOnce      sync.Once
)

// pendingSet counts background commit retries by the logger of the
// handler that started them, so that the exit hook logs those it
// abandons through that handler's logger.
type pendingSet struct {
	mu sync.Mutex
	m  map[*zap.Logger]int64
}

func (p *pendingSet) add(logger *zap.Logger, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[logger] += n; p.m[logger] == 0 {
		delete(p.m, logger)
	}
}

// Load returns the number of retries pending, all handlers together.
func (p *pendingSet) Load() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, k := range p.m {
		n += k
	}
	return n
}

// byLogger returns the retries pending, by handler logger.
func (p *pendingSet) byLogger() map[*zap.Logger]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.m)
}

// drainCommitRetries is a process-exit callback (caddy.OnExit): it runs
// after Caddy stopped serving and cleaned the config up. Then it parks
// every store that has something to do at exit (dedup.ExitParker).
func drainCommitRetries(context.Context) {
	deadline := time.Now().Add(exitCommitGrace)
	for pendingCommits.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for logger, n := range pendingCommits.byLogger() {
		metrics.commitErr.Add(float64(n))
		logger.Error("commit retries abandoned at exit", zap.Int64("events", n), zap.Duration("grace", exitCommitGrace))
	}
	parkAtExit()
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

func observe(op string, start time.Time, err error) {
	i := 0
	if err != nil {
		i = 1
	}
	observers[op][i].Observe(time.Since(start).Seconds())
}

// statusWriter records the final (non-1xx) status line the next handler
// writes. Flush, Hijack and the like reach the real writer through
// Unwrap (http.ResponseController).
type statusWriter struct {
	caddyhttp.ResponseWriterWrapper // by value: one allocation for both
	status                          atomic.Int32
}

func (sw *statusWriter) WriteHeader(code int) {
	if code >= 200 {
		sw.status.CompareAndSwap(0, int32(code))
	}
	sw.ResponseWriterWrapper.WriteHeader(code)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	sw.status.CompareAndSwap(0, http.StatusOK)
	return sw.ResponseWriterWrapper.Write(b)
}

func (sw *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	sw.status.CompareAndSwap(0, http.StatusOK)
	return io.Copy(&sw.ResponseWriterWrapper, r)
}
