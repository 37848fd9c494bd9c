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

// jsonRecord is a done record as Encode wrote it before compact records
// existed (and still writes it for the file, memory and PostgreSQL
// stores): these bytes must keep reading, whatever reads them.
const jsonRecord = `done:{"processed_at":"2024-12-02T12:00:01.123456789Z","event_type":"payment_intent.succeeded","fingerprint":"0123456789abcdef0123456789abcdef"}`

// TestCompactRecord: EncodeCompact keeps every field (processed_at to
// the millisecond), its fingerprint compares equal to the JSON form's,
// it is still a done record to Classify, Forgettable and Entry.State,
// and it fits the 44 bytes Redis keeps inside the key's object with a
// 16-character event type.
func TestCompactRecord(t *testing.T) {
	old, ok := DecodeDone(jsonRecord)
	if !ok {
		t.Fatal("today's JSON record no longer decodes")
	}
	val := old.EncodeCompact()
	if len(val) != 28+len(old.EventType) || val[:6] != DonePrefix+"\x01" {
		t.Fatalf("compact record %q (%d bytes): not the compact form", val, len(val))
	}
	got, ok := DecodeDone(val)
	if !ok || got.EventType != old.EventType || got.Fingerprint != old.Fingerprint || got.EventID != "" ||
		!got.ProcessedAt.Equal(old.ProcessedAt.Truncate(time.Millisecond)) {
		t.Fatalf("compact %q decoded as %+v, %v; want %+v to the millisecond", val, got, ok, old)
	}
	if Fingerprint(val) != Fingerprint(jsonRecord) || Fingerprint(val) != old.Fingerprint {
		t.Fatalf("fingerprints: compact %q, JSON %q", Fingerprint(val), Fingerprint(jsonRecord))
	}
	if Classify(val, "tok") != AlreadyDone || !Forgettable(val, false) || (Entry{Value: val}).State() != "done" {
		t.Fatal("a compact record is not a done record")
	}
	if short := (DoneRecord{ProcessedAt: time.Now(), EventType: "charge.refunded!", Fingerprint: old.Fingerprint}).EncodeCompact(); len(short) > 44 {
		t.Fatalf("a 16-character type makes %d bytes, more than Redis's 44 of an embedded string", len(short))
	}
	// what the compact form cannot hold exactly stays JSON, unchanged
	for _, rec := range []DoneRecord{
		{ProcessedAt: old.ProcessedAt, EventType: "t"},                                  // no fingerprint (older records)
		{ProcessedAt: old.ProcessedAt, EventType: "t", Fingerprint: "00ff"},             // not 16 bytes
		{ProcessedAt: old.ProcessedAt, Fingerprint: "0123456789ABCDEF0123456789abcdef"}, // upper case: compared as a string
		{ProcessedAt: old.ProcessedAt, Fingerprint: "0123456789abcdef0123456789abcdeg"}, // not hex
		{ProcessedAt: old.ProcessedAt, Fingerprint: old.Fingerprint, EventID: "evt_1"},  // a replay record
		{Fingerprint: old.Fingerprint},                                                  // the zero time
	} {
		if got := rec.EncodeCompact(); got != rec.Encode() {
			t.Errorf("%+v: compact %q, want the JSON form", rec, got)
		}
	}
	// a truncated compact record is no record, and has no fingerprint
	if _, ok := DecodeDone(val[:22]); ok || Fingerprint(val[:22]) != "" {
		t.Fatal("a truncated compact record decoded")
	}
}

// TestCompactRecordXXH64: the fingerprint the handler writes since
// xxh64 ("x" and 16 hex characters) is kept as 8 raw bytes (CompactV2)
// and read back exactly, so that a compact record stays compact and
// compares as its JSON form does; a malformed one stays JSON.
func TestCompactRecordXXH64(t *testing.T) {
	at := time.UnixMilli(1733140801123).UTC()
	rec := DoneRecord{ProcessedAt: at, EventType: "payment_intent.succeeded", Fingerprint: "x0123456789abcdef"}
	val := rec.EncodeCompact()
	if len(val) != 20+len(rec.EventType) || val[:6] != DonePrefix+"\x02" {
		t.Fatalf("compact record %q (%d bytes): not the compact form with an 8-byte fingerprint", val, len(val))
	}
	got, ok := DecodeDone(val)
	if !ok || got != rec {
		t.Fatalf("compact %q decoded as %+v, %v; want %+v", val, got, ok, rec)
	}
	if Fingerprint(val) != rec.Fingerprint || Fingerprint(rec.Encode()) != rec.Fingerprint {
		t.Fatalf("fingerprints: compact %q, JSON %q; want %q", Fingerprint(val), Fingerprint(rec.Encode()), rec.Fingerprint)
	}
	if Classify(val, "tok") != AlreadyDone {
		t.Fatal("a compact record is not a done record")
	}
	if short := (DoneRecord{ProcessedAt: at, EventType: "payment_intent.succeeded", Fingerprint: rec.Fingerprint}).EncodeCompact(); len(short) > 44 {
		t.Fatalf("a 24-character type makes %d bytes, more than Redis's 44 of an embedded string", len(short))
	}
	for _, fp := range []string{"x0123", "x0123456789ABCDEF", "x0123456789abcdeg", "x0123456789abcdef0", "y0123456789abcdef"} {
		r := DoneRecord{ProcessedAt: at, EventType: "t", Fingerprint: fp}
		if got := r.EncodeCompact(); got != r.Encode() {
			t.Errorf("fingerprint %q: compact %q, want the JSON form", fp, got)
		}
	}
	if _, ok := DecodeDone(val[:19]); ok || Fingerprint(val[:19]) != "" {
		t.Fatal("a truncated compact record decoded")
	}
}

// FuzzDoneRecordEncodings: for any record, the compact form decodes to
// what the JSON form does (processed_at to the millisecond) and gives
// the same fingerprint, EventType reads what DecodeDone does from each, so the handler's payload comparison cannot tell
// which form a store wrote.
func FuzzDoneRecordEncodings(f *testing.F) {
	f.Add(int64(1733140801123456789), "payment_intent.succeeded", "0123456789abcdef0123456789abcdef", "")
	f.Add(int64(0), "", "", "evt_1")
	f.Add(int64(1733140801123456789), "invoice.paid", "x0123456789abcdef", "")
	f.Add(int64(1733140801123456789), `a"b\\c<\x01é`, "x0123456789abcdef", "")
	f.Fuzz(func(t *testing.T, ns int64, typ, fp, id string) {
		rec := DoneRecord{ProcessedAt: time.Unix(0, ns).UTC(), EventType: typ, Fingerprint: fp, EventID: id}
		c, j := rec.EncodeCompact(), rec.Encode()
		dc, okc := DecodeDone(c)
		dj, okj := DecodeDone(j)
		if okc != okj || Fingerprint(c) != Fingerprint(j) {
			t.Fatalf("%+v: compact %q (%v, fp %q), JSON %q (%v, fp %q)", rec, c, okc, Fingerprint(c), j, okj, Fingerprint(j))
		}
		if EventType(c) != dc.EventType || EventType(j) != dj.EventType {
			t.Fatalf("%+v: event types %q (compact), %q (JSON); decoded %q, %q", rec, EventType(c), EventType(j), dc.EventType, dj.EventType)
		}
		// the compact form is exact (JSON replaces invalid UTF-8)
		if c != j && (!okc || dc.EventType != typ || dc.EventID != "" || dc.Fingerprint != fp ||
			!dc.ProcessedAt.Equal(rec.ProcessedAt.Truncate(time.Millisecond))) {
			t.Fatalf("%+v: compact decodes as %+v, JSON as %+v", rec, dc, dj)
		}
	})
}
