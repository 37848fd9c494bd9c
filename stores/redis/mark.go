package redis

import (
	"strconv"
	"strings"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Marks (dedup.MarkFor). A lease is stored as
// "inflight:<token>;mark=<ms>" with a time to live of its own ttl plus
// <ms> (dedup.MarkFor): the key outlives the lease by the mark's time.
// The lease is live while the key's remaining time (PTTL) is more than
// <ms>; after that the key is the mark of an attempt whose fate is
// unknown, and a claim of another token over it returns Reclaimed. Every
// judgement counts on Redis's own clock, as the key's expiry does.
//
// A lease that took over a mark (Reclaimed) has ";reclaimed" after the
// mark, so that a claim resent after its reply was lost answers
// Reclaimed again.
//
// A lease written by the previous release ("inflight:<token>", with no
// suffix and a time to live of lock_ttl) is live while it exists, and
// leaves no mark.
const (
	markTag      = ";mark="
	reclaimedTag = ";reclaimed"
)

// markSuffix is what follows the token in a lease's value.
var markSuffix = markTag + strconv.FormatInt(dedup.MarkFor.Milliseconds(), 10)

// splitMark splits a marked lease's value into the lease
// ("inflight:<token>") and the mark's time; ok is false for any other
// value (a done record, or a lease of the previous release).
func splitMark(v string) (lease string, mark time.Duration, ok bool) {
	if !strings.HasPrefix(v, dedup.InFlightPrefix) {
		return "", 0, false
	}
	i := strings.LastIndex(v, markTag)
	if i < 0 {
		return "", 0, false
	}
	ms, err := strconv.ParseInt(strings.TrimSuffix(v[i+len(markTag):], reclaimedTag), 10, 64)
	if err != nil || ms < 0 {
		return "", 0, false
	}
	return v[:i], time.Duration(ms) * time.Millisecond, true
}

// leaseOf returns the lease in a stored value, the mark's suffix left
// out: what the handler and operators see.
func leaseOf(v string) string {
	if lease, _, ok := splitMark(v); ok {
		return lease
	}
	return v
}
