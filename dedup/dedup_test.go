package dedup

import (
	"testing"
	"time"
)

// TestDoneRecordRoundTrip: what Encode writes, DecodeDone reads back,
// and Fingerprint finds without decoding, whatever the event type holds.
func TestDoneRecordRoundTrip(t *testing.T) {
	for _, rec := range []DoneRecord{
		{ProcessedAt: time.Unix(1733140801, 5).UTC(), EventType: "payment_intent.succeeded", Fingerprint: "00ff"},
		{ProcessedAt: time.Unix(1733140801, 0).UTC(), EventType: "a\"b\\c\n\"fingerprint\":\"x\"", EventID: "evt_1"},
		{ProcessedAt: time.Unix(1733140801, 0).UTC(), EventType: "bad utf-8 \xff"},
	} {
		val := rec.Encode()
		got, ok := DecodeDone(val)
		if !ok || !got.ProcessedAt.Equal(rec.ProcessedAt) || got.EventID != rec.EventID || got.Fingerprint != rec.Fingerprint {
			t.Errorf("%q decoded as %+v, %v; want %+v", val, got, ok, rec)
		}
		if fp := Fingerprint(val); fp != rec.Fingerprint {
			t.Errorf("%q: fingerprint %q, want %q", val, fp, rec.Fingerprint)
		}
	}
}

// BenchmarkDoneRecordEncode is the cost of encoding/json on the commit
// path (issue 17 item 4): compare with a commit's store round trip.
func BenchmarkDoneRecordEncode(b *testing.B) {
	rec := DoneRecord{ProcessedAt: time.Now(), EventType: "payment_intent.succeeded", Fingerprint: "0123456789abcdef0123456789abcdef"}
	b.ReportAllocs()
	for b.Loop() {
		_ = rec.Encode()
	}
}
