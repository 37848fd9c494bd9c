// Package dedup is the contract between the sangho_dedup handler and
// the modules it loads: stores (namespace http.sangho_dedup.stores),
// which keep the state of events, and providers (namespace
// http.sangho_dedup.providers), which check a sender's signature and say
// where the event ID is.
//
// A third-party store or provider imports this package only (and Caddy),
// registers its module with caddy.RegisterModule, and, for a store, runs
// the contract suite of package dedupstoretest in its tests.
package dedup

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"
)

// Store keeps the dedup state of events, one key per event. Every
// method is one atomic operation on one key (a round trip or two for a
// network store: PostgreSQL tries a lean statement first and runs the
// full one only when the lean one changed nothing), so a store can be
// shared by many Caddy instances and sharded (Redis Cluster) by key.
//
// A store may also implement DataSharer, UseCounter and ExitParker.
type Store interface {
	// Claim creates key holding an in-flight lease owned by token, with
	// a time to live of ttl, only if key does not exist (or has
	// expired). If it exists, Claim reports what it holds (done or in
	// flight), returns the value it found, and changes nothing. A lease
	// that holds the caller's own token counts as Claimed (a retried
	// claim whose first attempt reached the store: the same delivery,
	// which passed nothing on yet), live or run out, and lives ttl again;
	// a store that can tell answers Reclaimed if that first attempt took
	// over a mark. Over another token's lease whose time ran out, a store
	// that keeps marks (see MarkFor) takes the key and returns Reclaimed
	// with the lease it replaced. An error never means "duplicate".
	Claim(ctx context.Context, key, token string, ttl time.Duration) (ClaimResult, string, error)

	// Renew extends the lease on key to ttl if key still holds the
	// in-flight lease of token, live (a lease whose time ran out is not
	// renewed), and reports whether it did.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error)

	// Commit turns key into the done record rec, with a time to live of
	// retention, and reports whether key still held the lease of token
	// (false: the lease was lost, yet the event is recorded as done all
	// the same, since the backend did process it; for the token's own
	// lease whose time ran out, a store may say either). A nil error
	// means the record is as durable as the store promises (on disk,
	// replicated). It replaces a mark like any value.
	Commit(ctx context.Context, key, token string, rec DoneRecord, retention time.Duration) (bool, error)

	// Release deletes key if it still holds the in-flight lease of
	// token, and reports whether it did. A released lease leaves no mark;
	// a store may delete the token's own lease whose time ran out too
	// (the Redis and PostgreSQL stores do: its fate is known now). A store
	// may report a key already absent as released, nothing holding it (the
	// Redis store does: its client sends a release whose reply was lost
	// again, and that finds the key deleted).
	Release(ctx context.Context, key, token string) (bool, error)

	// Get returns what key holds, for operators; a zero Entry if absent.
	Get(ctx context.Context, key string) (Entry, error)

	// Forget deletes key if it holds a done record, or, with force, a
	// lease or a mark too (Forgettable), so that the next delivery of the
	// event is processed. It returns what key held and whether it
	// deleted it.
	Forget(ctx context.Context, key string, force bool) (Entry, bool, error)
}

// DataSharer is a store that can tell which data it reaches (a file, a
// Redis database, a PostgreSQL table), so that the handler can refuse
// two endpoints that would share keys: two handlers whose stores return
// the same DataID must use different key_prefix values. A store that
// does not implement it reaches data of its own (two instances never
// share keys).
type DataSharer interface {
	// DataID names the data the store reaches as Provision settled it
	// (e.g. "file:/var/lib/caddy/dedup.db", "redis:127.0.0.1:6379/0").
	DataID() string
}

// DataAliaser is a DataSharer whose shared resource (a connection pool,
// a client) was named otherwise by an earlier config of this process:
// opened while its server could not be asked which data it reaches, it
// was named by its addresses, and is named by the server's answer since
// a later load. DataAliases returns those earlier IDs, so that the
// handler's forget also stops the commit retries registered under them.
type DataAliaser interface {
	DataAliases() []string
}

// UseCounter is a store that counts its uses (Enter, Leave) because its
// Cleanup releases a resource (a connection pool, an open file) that
// deliveries may still need after Caddy has cleaned their config up: on a reload, Caddy starts the new config,
// then cleans the old one up without waiting for its requests in
// flight. The handler calls Enter before it uses the store for a
// delivery or a background commit retry and Leave after; the store
// keeps its resource until the uses end (at most DrainFor).
type UseCounter interface {
	Enter()
	Leave()
}

// ExitParker is a store with something to do when the process exits,
// after the handler's background commit retries have landed or been
// given up (Caddy runs its exit callbacks in no set order): the file
// store parks its live leases so that none is lost with the process.
// The handler calls ParkAtExit once at exit on one store of each type
// that implements it (the last one loaded): ParkAtExit must act on every
// resource of its type still open in the process, since the configs
// that used them may have been cleaned up (the file store parks the
// leases of every file still open).
type ExitParker interface {
	ParkAtExit()
}

// CommitRetryFor is how long the handler retries, in the background, a
// done record that failed to be written; DrainFor is how long a store
// that implements UseCounter keeps its resource for the uses still in
// flight after Cleanup.
const (
	CommitRetryFor = 5 * time.Minute
	DrainFor       = CommitRetryFor + time.Minute
)

// Entry is a key's value (a done record or an in-flight lease, "" when
// absent) and when it expires: of a lease, its own expiry, in the past
// for a mark (the key itself is kept MarkFor longer).
type Entry struct {
	Value     string
	ExpiresAt time.Time
	// Mark: Value is a lease whose time ran out (ExpiresAt is past by the
	// store's own clock), kept as the mark of an attempt whose fate is
	// unknown (see MarkFor).
	Mark bool
}

// State is "absent", "done", "in_flight", or "unknown": a mark (see
// Mark).
func (e Entry) State() string {
	switch {
	case e.Value == "":
		return "absent"
	case strings.HasPrefix(e.Value, DonePrefix):
		return "done"
	case e.Mark:
		return "unknown"
	}
	return "in_flight"
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
	// Reclaimed: the key held another token's lease whose time had run
	// out (an attempt whose fate nobody knows: its Caddy died, or it was
	// held after a timeout) and now holds our lease. The handler passes
	// such a delivery on marked, so that the backend can check its own
	// records (see MarkFor). A store that cannot tell returns Claimed.
	Reclaimed
)

// MarkFor is how long a store that returns Reclaimed keeps a lease whose
// time has run out, as the mark of an attempt whose fate is unknown:
// longer than any supported sender keeps redelivering (Sangho 48 hours,
// Stripe 3 days). A released lease leaves no mark (the backend said it
// failed, or never got the event); a commit replaces it.
const MarkFor = 7 * 24 * time.Hour

func (c ClaimResult) String() string {
	switch c {
	case Claimed:
		return "claimed"
	case AlreadyDone:
		return "done"
	case InFlight:
		return "in_flight"
	case Reclaimed:
		return "reclaimed"
	}
	return "unknown"
}

// Stored values. An in-flight lease is "inflight:<token>"; a done record
// is "done:" followed by a small JSON object (Encode), readable with
// redis-cli or psql, or by a compact binary record (EncodeCompact).
const (
	InFlightPrefix = "inflight:"
	DonePrefix     = "done:"
)

// LeaseValue is the value of an in-flight lease held by token.
func LeaseValue(token string) string { return InFlightPrefix + token }

// IsLease reports whether val is the in-flight lease of token, without
// building the lease string.
func IsLease(val, token string) bool {
	return len(val) == len(InFlightPrefix)+len(token) &&
		val[:len(InFlightPrefix)] == InFlightPrefix && val[len(InFlightPrefix):] == token
}

// Classify maps a stored value to a ClaimResult for the caller holding
// token: a lease that holds the caller's own token counts as Claimed.
func Classify(val, token string) ClaimResult {
	if strings.HasPrefix(val, DonePrefix) {
		return AlreadyDone
	}
	if IsLease(val, token) {
		return Claimed
	}
	return InFlight
}

// Forgettable reports whether Forget deletes a key holding val: a done
// record, or with force a lease too.
func Forgettable(val string, force bool) bool {
	return val != "" && (force || strings.HasPrefix(val, DonePrefix))
}

// DoneRecord is what is remembered of a processed event, like a row of
// the processed_webhook_events table of Sangho's guide, with a
// fingerprint of the body that was processed.
type DoneRecord struct {
	ProcessedAt time.Time `json:"processed_at"`
	// EventType is the event's type ("" when unknown).
	EventType string `json:"event_type"`
	// EventID is set in the handler's replay records (one per accepted
	// signed message whose event ID is not signed): the ID the message
	// came with. Empty in an event's own record, whose key is its ID.
	EventID string `json:"event_id,omitempty"`
	// Fingerprint tells the body apart: "x" and the hex of the body's
	// xxh64; the hex of the first 16 bytes of its SHA-256 in records
	// written by earlier versions; empty in records written before
	// fingerprints existed.
	Fingerprint string `json:"fingerprint,omitempty"`
}

// Encode renders the record as the stored value
// `done:{"processed_at":...,"event_type":...,"fingerprint":...}`.
func (r DoneRecord) Encode() string {
	r.ProcessedAt = r.ProcessedAt.UTC()
	b, err := json.Marshal(r)
	if err != nil { // a time.Time past year 9999: not from a clock
		r.ProcessedAt = time.Time{}
		b, _ = json.Marshal(r)
	}
	return DonePrefix + string(b)
}

// The byte after DonePrefix in a compact done record (EncodeCompact),
// which says the fingerprint's form; a JSON record has '{' there.
const (
	// CompactV1: the fingerprint of versions before xxh64, the first 16
	// bytes of the body's SHA-256 (32 hex characters), as 16 bytes.
	CompactV1 = 0x01
	// CompactV2: the xxh64 fingerprint ("x" and 16 hex characters), as
	// 8 bytes.
	CompactV2 = 0x02
)

// compactHead is the size of a compact record before its fingerprint:
// "done:", the version byte, processed_at.
const compactHead = len(DonePrefix) + 1 + 6

// compactFingerprint is the size of a compact record's fingerprint and
// the prefix its text form has, by version; ok false for another byte.
func compactFingerprint(version byte) (size int, prefix string, ok bool) {
	switch version {
	case CompactV1:
		return 16, "", true
	case CompactV2:
		return 8, "x", true
	}
	return 0, "", false
}

// EncodeCompact renders the record in the compact binary form, for a
// store that pays for every byte (Redis keeps values of at most 44 bytes
// inside its key's object):
//
//	"done:" <version> <processed_at: Unix milliseconds, 6 bytes big-endian>
//	<fingerprint: 8 bytes (CompactV2) or 16 (CompactV1)> <event type: the rest>
//
// The record keeps the "done:" prefix, so that a store's scripts, and
// the versions before this one, still tell it from a lease. processed_at
// keeps milliseconds. A record the form cannot hold exactly (no
// fingerprint or one of neither form in lower-case hex, an EventID, a
// time before 1970 or past year 10889) is rendered by Encode.
// DecodeDone and Fingerprint read every form.
func (r DoneRecord) EncodeCompact() string {
	ms := r.ProcessedAt.UnixMilli()
	if r.EventID != "" || ms < 0 || ms >= 1<<48 {
		return r.Encode()
	}
	version := byte(CompactV1)
	if strings.HasPrefix(r.Fingerprint, "x") {
		version = CompactV2
	}
	size, prefix, _ := compactFingerprint(version)
	fp := r.Fingerprint[len(prefix):]
	if len(fp) != 2*size {
		return r.Encode()
	}
	b := make([]byte, compactHead+size, compactHead+size+len(r.EventType))
	copy(b, DonePrefix)
	b[len(DonePrefix)] = version
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], uint64(ms))
	copy(b[len(DonePrefix)+1:], t[2:])
	if n, err := hex.Decode(b[compactHead:], []byte(fp)); err != nil || n != size ||
		hex.EncodeToString(b[compactHead:]) != fp {
		return r.Encode() // upper case or not hex: kept as it is
	}
	return string(append(b, r.EventType...))
}

// compactParts splits a compact record (val, "done:" included) into its
// processed_at, fingerprint (text form) and event type; ok false if val
// is not one.
func compactParts(val string) (ms int64, fp, typ string, ok bool) {
	if len(val) <= len(DonePrefix) {
		return 0, "", "", false
	}
	size, prefix, known := compactFingerprint(val[len(DonePrefix)])
	if !known || len(val) < compactHead+size {
		return 0, "", "", false
	}
	var t [8]byte
	copy(t[2:], val[len(DonePrefix)+1:compactHead])
	fp = prefix + hex.EncodeToString([]byte(val[compactHead:compactHead+size]))
	return int64(binary.BigEndian.Uint64(t[:])), fp, val[compactHead+size:], true
}

// isCompact reports whether a done record's text after "done:" is in
// the compact form (a version byte, not JSON's '{').
func isCompact(raw string) bool {
	_, _, ok := compactFingerprint(firstByte(raw))
	return ok
}

func firstByte(s string) byte {
	if s == "" {
		return 0
	}
	return s[0]
}

// DecodeDone parses a done record written by Encode (or by an older
// version, without a fingerprint) or by EncodeCompact.
func DecodeDone(val string) (DoneRecord, bool) {
	raw, ok := strings.CutPrefix(val, DonePrefix)
	if !ok {
		return DoneRecord{}, false
	}
	if isCompact(raw) {
		ms, fp, typ, ok := compactParts(val)
		if !ok {
			return DoneRecord{}, false
		}
		return DoneRecord{ProcessedAt: time.UnixMilli(ms).UTC(), EventType: typ, Fingerprint: fp}, true
	}
	var r DoneRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return DoneRecord{}, false
	}
	return r, true
}

// Fingerprint returns the fingerprint in a stored value: of a done
// record, or of a lease whose token carries one (token "<x>.<fp>").
// Empty when it has none. Cheap: no JSON decoding on the hot path.
func Fingerprint(val string) string {
	if raw, ok := strings.CutPrefix(val, DonePrefix); ok {
		if isCompact(raw) {
			_, fp, _, _ := compactParts(val)
			return fp
		}
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
	if tok, ok := strings.CutPrefix(val, InFlightPrefix); ok {
		return TokenFingerprint(tok)
	}
	return ""
}

// EventType returns the event type in a done record ("" in anything
// else). Cheap, as Fingerprint: JSON is decoded only when the type holds
// an escape.
func EventType(val string) string {
	raw, ok := strings.CutPrefix(val, DonePrefix)
	if !ok {
		return ""
	}
	if isCompact(raw) {
		_, _, typ, _ := compactParts(val)
		return typ
	}
	// Encode writes processed_at (a time, no quote in it) and then
	// event_type: the first match is the key.
	const k = `"event_type":"`
	if i := strings.Index(raw, k); i >= 0 {
		t := raw[i+len(k):]
		if j := strings.IndexAny(t, `"\`); j >= 0 && t[j] == '"' {
			return t[:j]
		}
	}
	r, _ := DecodeDone(val)
	return r.EventType
}

// TokenFingerprint returns the fingerprint a lease token carries after
// its last ".", or "".
func TokenFingerprint(token string) string {
	if i := strings.LastIndexByte(token, '.'); i >= 0 {
		return token[i+1:]
	}
	return ""
}
