package sanghodedup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// Store keeps the dedup state of events, one key per event. Every
// method is one atomic operation on one key (one round trip for a
// network store), so a store can be shared by many Caddy instances and
// sharded (Redis Cluster) by key.
//
// A store is a Caddy module in the namespace http.sangho_dedup.stores;
// another plugin can add one without touching this package.
type Store interface {
	// Claim creates key holding an in-flight lease owned by token, with
	// a time to live of ttl, only if key does not exist. If it exists,
	// Claim reports what it holds (done or in flight), returns the value
	// it found, and changes nothing. An error never means "duplicate".
	Claim(ctx context.Context, key, token string, ttl time.Duration) (ClaimResult, string, error)

	// Renew extends the lease on key to ttl if key still holds the
	// in-flight lease of token, and reports whether it did.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error)

	// Commit turns key into the done record rec, with a time to live of
	// retention, and reports whether key still held the lease of token
	// (false: the lease was lost, yet the event is recorded as done all
	// the same, since the backend did process it).
	Commit(ctx context.Context, key, token string, rec DoneRecord, retention time.Duration) (bool, error)

	// Release deletes key if it still holds the in-flight lease of
	// token, and reports whether it did.
	Release(ctx context.Context, key, token string) (bool, error)

	// Get returns what key holds, for operators; a zero Entry if absent.
	Get(ctx context.Context, key string) (Entry, error)

	// Forget deletes key if it holds a done record, or, with force, a
	// lease too, so that the next delivery of the event is processed.
	// It returns what key held and whether it deleted it.
	Forget(ctx context.Context, key string, force bool) (Entry, bool, error)
}

// Entry is a key's value ("done:{...}" or "inflight:<token>"; "" when
// absent) and when it expires.
type Entry struct {
	Value     string
	ExpiresAt time.Time
}

// State is "absent", "done" or "in_flight".
func (e Entry) State() string {
	switch {
	case e.Value == "":
		return "absent"
	case strings.HasPrefix(e.Value, donePrefix):
		return "done"
	}
	return "in_flight"
}

// forgettable reports whether Forget deletes a key holding val.
func forgettable(val string, force bool) bool {
	return val != "" && (force || strings.HasPrefix(val, donePrefix))
}

// ClaimResult is what a Claim found.
type ClaimResult int

const (
	// Claimed: the key was absent and now holds our lease.
	Claimed ClaimResult = iota
	// AlreadyDone: the event was processed before.
	AlreadyDone
	// InFlight: another delivery of the event holds the lease.
	InFlight
)

func (c ClaimResult) String() string {
	switch c {
	case Claimed:
		return "claimed"
	case AlreadyDone:
		return "done"
	case InFlight:
		return "in_flight"
	}
	return "unknown"
}

// DoneRecord is what is remembered of a processed event, like a row of
// the processed_webhook_events table of Sangho's guide, with a
// fingerprint of the body that was processed.
type DoneRecord struct {
	ProcessedAt time.Time
	EventType   string
	// Fingerprint is the hex of the first 16 bytes of the body's
	// SHA-256; empty in records written before fingerprints existed.
	Fingerprint string
}

// Stored values. An in-flight lease is "inflight:<token>"; a done record
// is "done:" followed by a small JSON object, readable with redis-cli.
const (
	inflightPrefix = "inflight:"
	donePrefix     = "done:"
)

func inflightValue(token string) string { return inflightPrefix + token }

// isLease reports whether val is the in-flight lease of token, without
// building the lease string.
func isLease(val, token string) bool {
	return len(val) == len(inflightPrefix)+len(token) &&
		val[:len(inflightPrefix)] == inflightPrefix && val[len(inflightPrefix):] == token
}

// encode renders the done record as
// `done:{"processed_at":...,"event_type":...,"fingerprint":...}`.
func (r DoneRecord) encode() string {
	b := make([]byte, 0, 112+len(r.EventType))
	b = append(b, donePrefix+`{"processed_at":"`...)
	b = r.ProcessedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","event_type":`...)
	b = appendJSONString(b, r.EventType)
	if r.Fingerprint != "" {
		b = append(b, `,"fingerprint":`...)
		b = appendJSONString(b, r.Fingerprint)
	}
	b = append(b, '}')
	return string(b)
}

// decodeDone parses a done record written by encode (or by an older
// version, without a fingerprint).
func decodeDone(val string) (DoneRecord, bool) {
	raw, ok := strings.CutPrefix(val, donePrefix)
	if !ok {
		return DoneRecord{}, false
	}
	var j struct {
		ProcessedAt time.Time `json:"processed_at"`
		EventType   string    `json:"event_type"`
		Fingerprint string    `json:"fingerprint"`
	}
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		return DoneRecord{}, false
	}
	return DoneRecord{ProcessedAt: j.ProcessedAt, EventType: j.EventType, Fingerprint: j.Fingerprint}, true
}

// recordFingerprint returns the fingerprint in a stored value: of a done
// record, or of a lease whose token carries one (token.fingerprint).
// Empty when it has none. Cheap: no JSON decoding on the hot path.
func recordFingerprint(val string) string {
	if strings.HasPrefix(val, donePrefix) {
		const k = `"fingerprint":"`
		i := strings.LastIndex(val, k)
		if i < 0 {
			return ""
		}
		fp := val[i+len(k):]
		if j := strings.IndexByte(fp, '"'); j >= 0 {
			return fp[:j]
		}
		return ""
	}
	if tok, ok := strings.CutPrefix(val, inflightPrefix); ok {
		return tokenFingerprint(tok)
	}
	return ""
}

// tokenFingerprint returns the fingerprint a lease token carries after
// its last ".", or "".
func tokenFingerprint(token string) string {
	if i := strings.LastIndexByte(token, '.'); i >= 0 {
		return token[i+1:]
	}
	return ""
}

// appendJSONString appends s as a JSON string, escaping what JSON needs.
func appendJSONString(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// classify maps a stored value to a ClaimResult, given the token of the
// caller: a lease that holds our own token counts as Claimed, which
// happens when a client retried a claim whose first attempt did reach
// the store.
func classify(val, token string) ClaimResult {
	if strings.HasPrefix(val, donePrefix) {
		return AlreadyDone
	}
	if isLease(val, token) {
		return Claimed
	}
	return InFlight
}

// msDuration is ms milliseconds (a time to live that Redis returned)
// as a Duration, saturated at the longest Duration, never wrapped.
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// Lease tokens: a random per-process prefix and a counter, unique across
// instances and cheaper than reading crypto/rand on every request.
var (
	tokenPrefix = func() string {
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("sangho_dedup: reading random token prefix: " + err.Error())
		}
		return hex.EncodeToString(b[:]) + "-"
	}()
	tokenCounter atomic.Uint64
)

func newToken() string {
	return tokenPrefix + strconv.FormatUint(tokenCounter.Add(1), 36)
}

// stateID names the Redis data this store reaches, as Provision
// settled it (see resolvedOptions.stateID).
func (s *RedisStore) stateID() string { return s.state }

// storePool shares store state across config reloads: Redis clients,
// the memory store's map, the file store's open database.
var storePool = caddy.NewUsagePool()

// storeUser is a store whose Cleanup releases a resource shared through
// storePool (a Redis client, an open file) that deliveries may still
// need after Caddy has cleaned their config up: on a reload, Caddy
// starts the new config, then cleans the old one up without waiting for
// its requests in flight. enter marks the store as in use, leave undoes
// one enter.
type storeUser interface {
	enter()
	leave()
}

// poolUsers counts the deliveries and commit retries that may still
// need a resource shared through storePool (a Redis client, an open
// file). On a reload Caddy starts the new config, then cleans the old one
// up without waiting for its requests in flight: release keeps the
// resource until they are done, for at most drainFor.
type poolUsers struct{ n atomic.Int64 }

func (u *poolUsers) enter() { u.n.Add(1) }
func (u *poolUsers) leave() { u.n.Add(-1) }

// release gives up this config's use of the pooled resource key, at
// once if nothing uses it, else in the background once nothing does.
func (u *poolUsers) release(key string, logger *zap.Logger) error {
	if u.n.Load() == 0 {
		_, err := storePool.Delete(key)
		return err
	}
	go func() {
		deadline := time.Now().Add(drainFor)
		for u.n.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := storePool.Delete(key); err != nil && logger != nil {
			logger.Error("shared store close failed", zap.String("resource", key), zap.Error(err))
		}
	}()
	return nil
}

// drainFor bounds how long a cleaned-up config keeps a shared resource
// for the deliveries and commit retries it still has in flight.
const drainFor = commitRetryFor + time.Minute
