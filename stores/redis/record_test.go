package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// TestRedisCommitsCompactRecords: a commit stores the compact record
// (dedup.DoneRecord.EncodeCompact), which Redis keeps as an embedded
// string when it fits 44 bytes, and every operation reads it back as
// the done record it is.
func TestRedisCommitsCompactRecords(t *testing.T) {
	srv := startRedis(t)
	c := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	fp := "0123456789abcdef0123456789abcdef"
	rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "charge.succeeded", Fingerprint: fp}
	key := testKeyPrefix + "evt_compact"
	tok := newToken() + "." + fp
	if res, _, err := s.Claim(ctx, key, tok, time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	if held, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil || !held {
		t.Fatalf("commit = %v, %v", held, err)
	}
	if v := c.Get(ctx, key).Val(); v != rec.EncodeCompact() || len(v) > 44 {
		t.Fatalf("stored %q (%d bytes), want the compact record of at most 44 bytes", v, len(v))
	}
	if enc := c.ObjectEncoding(ctx, key).Val(); enc != "embstr" {
		t.Fatalf("redis holds the record as %q, want embstr", enc)
	}
	// a retried commit whose first attempt landed finds its own record
	if held, err := s.Commit(ctx, key, tok, rec, time.Hour); err != nil || !held {
		t.Fatalf("retried commit = %v, %v; want held", held, err)
	}
	res, found, err := s.Claim(ctx, key, newToken()+"."+fp, time.Minute)
	if err != nil || res != dedup.AlreadyDone || dedup.Fingerprint(found) != fp {
		t.Fatalf("claim of the done key = %v, %q, %v; want done with fingerprint %s", res, found, err, fp)
	}
	e, err := s.Get(ctx, key)
	got, ok := dedup.DecodeDone(e.Value)
	if err != nil || e.State() != "done" || !ok || got.EventType != rec.EventType ||
		!got.ProcessedAt.Equal(rec.ProcessedAt.Truncate(time.Millisecond)) {
		t.Fatalf("get = %+v (%+v), %v", e, got, err)
	}
}

// TestRedisReadsJSONRecords: done records written before compact ones
// (dedup.DoneRecord.Encode, by the same SET ... PX the store sent) are
// still done to a claim, which returns them with their fingerprint for
// the handler's payload comparison (same body: a duplicate; another
// body: a mismatch), read by get, deleted by forget, and expire.
func TestRedisReadsJSONRecords(t *testing.T) {
	srv := startRedis(t)
	c := srv.Client(t)
	for _, cache := range []int{0, 100} {
		s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, LocalCache: &cache})
		ctx := context.Background()
		fp := "0123456789abcdef0123456789abcdef"
		rec := dedup.DoneRecord{ProcessedAt: time.Unix(1733140801, 123456789), EventType: "payment_intent.succeeded", Fingerprint: fp}
		old := rec.Encode()
		key := testKeyPrefix + "evt_json"
		if err := c.Set(ctx, key, old, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second claim may be answered by the local cache
			res, found, err := s.Claim(ctx, key, newToken()+"."+fp, time.Minute)
			if err != nil || res != dedup.AlreadyDone || found != old || dedup.Fingerprint(found) != fp {
				t.Fatalf("claim of a JSON record = %v, %q, %v; want done, the record", res, found, err)
			}
			if other := "f" + fp[1:]; dedup.Fingerprint(found) == other {
				t.Fatal("another body's fingerprint compares equal")
			}
		}
		e, err := s.Get(ctx, key)
		got, ok := dedup.DecodeDone(e.Value)
		if err != nil || e.State() != "done" || !ok || got != (dedup.DoneRecord{ProcessedAt: rec.ProcessedAt.UTC(), EventType: rec.EventType, Fingerprint: fp}) {
			t.Fatalf("get of a JSON record = %+v (%+v), %v", e, got, err)
		}
		if d := time.Until(e.ExpiresAt); d < 59*time.Minute || d > time.Hour {
			t.Fatalf("expires in %v, want about an hour", d)
		}
		if e, deleted, err := s.Forget(ctx, key, false); err != nil || !deleted || e.Value != old {
			t.Fatalf("forget of a JSON record = %+v, %v, %v; want deleted", e, deleted, err)
		}
		if res, _, err := s.Claim(ctx, key, newToken()+"."+fp, time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim after forget = %v, %v; want claimed", res, err)
		}
		// a JSON record expires as its PX said
		c.Del(ctx, key)
		if err := c.Set(ctx, key, old, 50*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if res, _, err := s.Claim(ctx, key, newToken()+"."+fp, time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim after the JSON record expired = %v, %v; want claimed", res, err)
		}
		c.Del(ctx, key)
	}
}
