package file

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/testclock"
)

var encodingAt = time.Date(2026, 12, 5, 5, 20, 1, 123456789, time.UTC)

const encodingFP = "0123456789abcdef0123456789abcdef"

// checkRoundTrip writes rec as a done record expiring at exp and reads it
// back: the string and the fingerprint the other layers compare must be
// those of rec.Encode(). It returns the value on disk.
func checkRoundTrip(t *testing.T, rec dedup.DoneRecord, exp uint64) []byte {
	t.Helper()
	want := rec.Encode()
	raw := newDoneValue(rec).encode(exp)
	gotExp, got, err := decodeRecord(raw)
	if err != nil || got != want || gotExp != exp {
		t.Fatalf("%#v at %d: read back %q, %d, %v; want %q", rec, exp, got, gotExp, err, want)
	}
	if dedup.Fingerprint(got) != dedup.Fingerprint(want) {
		t.Fatalf("%#v: fingerprint %q, want %q", rec, dedup.Fingerprint(got), dedup.Fingerprint(want))
	}
	if e, err := decodeExpiry(raw); err != nil || e != exp {
		t.Fatalf("%#v: expiry %d, %v; want %d", rec, e, err, exp)
	}
	checkAnswer(t, raw, exp, rec)
	return raw
}

// checkAnswer: a claim's answer (decodeAnswer) is rec, in dedup's
// compact form, without JSON, when it has a fingerprint and no event ID
// and its value on disk is compact (processed_at then to the
// millisecond, as that form keeps it); else exactly decodeRecord's.
func checkAnswer(t *testing.T, raw []byte, exp uint64, rec dedup.DoneRecord) {
	t.Helper()
	gotExp, got, err := decodeAnswer(raw)
	_, exact, _ := decodeRecord(raw)
	if err != nil || gotExp != exp {
		t.Fatalf("%#v: answer %q, %d, %v; want expiry %d", rec, got, gotExp, err, exp)
	}
	compact := (raw[0] == recordV2 || raw[0] == recordV3) && rec.Fingerprint != "" && rec.EventID == ""
	if !compact {
		if got != exact {
			t.Fatalf("%#v: answer %q, want %q", rec, got, exact)
		}
		return
	}
	if got != rec.EncodeCompact() || strings.HasPrefix(got, dedup.DonePrefix+"{") {
		t.Fatalf("%#v: answer %q, want the compact form %q", rec, got, rec.EncodeCompact())
	}
	back, ok := dedup.DecodeDone(got)
	want := rec
	want.ProcessedAt = rec.ProcessedAt.Truncate(time.Millisecond).UTC()
	if !ok || back != want || dedup.Fingerprint(got) != rec.Fingerprint {
		t.Fatalf("%#v: answer %q reads as %#v, %v; want %#v", rec, got, back, ok, want)
	}
}

// TestDoneRecordEncoding: every done record reads back as exactly the
// string the other stores hold; those from a clock, with a fingerprint
// as the handler writes it, in the compact recordV3 (recordV2 with the
// SHA-256 fingerprint of earlier versions), the others in recordV1.
func TestDoneRecordEncoding(t *testing.T) {
	exp := unixNano(encodingAt.Add(72 * time.Hour))
	for _, tc := range []struct {
		name    string
		rec     dedup.DoneRecord
		version byte
	}{
		{"as the handler writes it (xxh64)", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded", Fingerprint: "x0123456789abcdef"}, recordV3},
		{"xxh64, replay record with event ID", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "push", EventID: "evt_1", Fingerprint: "x0123456789abcdef"}, recordV3},
		{"xxh64 in upper case", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: "x0123456789ABCDEF"}, recordV1},
		{"xxh64 cut short", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: "x0123"}, recordV1},
		{"an x alone", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: "x"}, recordV1},
		{"SHA-256, as earlier versions wrote it", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded", Fingerprint: encodingFP}, recordV2},
		{"replay record with event ID", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "push", EventID: "evt_1", Fingerprint: encodingFP}, recordV2},
		{"no fingerprint", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded"}, recordV2},
		{"empty type", dedup.DoneRecord{ProcessedAt: encodingAt, Fingerprint: encodingFP}, recordV2},
		{"quotes and escapes", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "a\"b\\c\n<&>\u2028", Fingerprint: encodingFP}, recordV2},
		{"unicode", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "paiement.réussi.支付.🎉", Fingerprint: encodingFP}, recordV2},
		{"invalid UTF-8", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "a\xffb\xc3", Fingerprint: encodingFP}, recordV2},
		{"long type", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: strings.Repeat("x", 300), Fingerprint: encodingFP}, recordV2},
		{"fingerprint-like type", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: `","fingerprint":"ff`, Fingerprint: encodingFP}, recordV2},
		{"local time zone", dedup.DoneRecord{ProcessedAt: encodingAt.In(time.FixedZone("X", 3600)), EventType: "t", Fingerprint: encodingFP}, recordV2},
		{"whole second", dedup.DoneRecord{ProcessedAt: encodingAt.Truncate(time.Second), EventType: "t"}, recordV2},
		{"the epoch", dedup.DoneRecord{ProcessedAt: time.Unix(0, 0), EventType: "t"}, recordV2},
		{"processed after its expiry", dedup.DoneRecord{ProcessedAt: encodingAt.Add(100 * time.Hour), EventType: "t"}, recordV2},
		{"zero time", dedup.DoneRecord{EventType: "t", Fingerprint: encodingFP}, recordV1},
		{"before 1970", dedup.DoneRecord{ProcessedAt: time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), EventType: "t"}, recordV1},
		{"past 2262", dedup.DoneRecord{ProcessedAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), EventType: "t"}, recordV1},
		{"past 9999", dedup.DoneRecord{ProcessedAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), EventType: "t"}, recordV1},
		{"upper-case fingerprint", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: strings.ToUpper(encodingFP)}, recordV1},
		{"short fingerprint", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: "0123456789abcdef"}, recordV1},
		{"not hex", dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t", Fingerprint: "not hex"}, recordV1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := checkRoundTrip(t, tc.rec, exp)
			if raw[0] != byte(tc.version) {
				t.Errorf("written as version %d, want %d", raw[0], tc.version)
			}
		})
	}
	// An expiry past int64 (a bbolt file's saturated one): recordV1.
	raw := checkRoundTrip(t, dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t"}, math.MaxUint64)
	if raw[0] != recordV1 {
		t.Errorf("expiry past int64: written as version %d, want %d", raw[0], recordV1)
	}
	raw = checkRoundTrip(t, dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "t"}, math.MaxInt64)
	if raw[0] != recordV2 {
		t.Errorf("expiry math.MaxInt64: written as version %d, want %d", raw[0], recordV2)
	}
}

// TestDoneRecordEncodingSize: the record the handler writes takes a
// third of its recordV1 size on disk (before Pebble's compression).
func TestDoneRecordEncodingSize(t *testing.T) {
	rec := BenchRecord("sangho_dedup:evt_3MtwBwLkdIwHu7ix28a3tqPa", encodingAt)
	exp := unixNano(encodingAt.Add(72 * time.Hour))
	v1 := len(encodeRecord(exp, rec.Encode()))
	v2 := len(newDoneValue(rec).encode(exp))
	// version 1 + expiry 8 + processed_at 7 + type 1+24 + ID 1+28 + fingerprint 16
	if want := 1 + 8 + 7 + 1 + len(rec.EventType) + 1 + len(rec.EventID) + 16; v2 != want {
		t.Errorf("recordV2 of %#v: %d bytes, want %d (recordV1: %d)", rec, v2, want, v1)
	}
	t.Logf("recordV1 %d bytes, recordV2 %d bytes", v1, v2)
}

// randomType is an event type from a mix of the odd: empty, ASCII,
// quotes and control characters, multi-byte runes, invalid UTF-8.
func randomType(r *rand.Rand) string {
	alphabet := []string{"a", "Z", "_", ".", "\"", "\\", "\n", "\x00", "\x1f", "<", "&", "é", "支", "🎉", "\u2028", "\xff", "\xc3", " "}
	n := r.IntN(40)
	if r.IntN(8) == 0 {
		n = 0
	}
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// TestDoneRecordEncodingRandom: random records (times, types, event IDs,
// fingerprints of every shape) read back as exactly their string.
func TestDoneRecordEncodingRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	v2 := 0
	const n = 20000
	for range n {
		var rec dedup.DoneRecord
		switch r.IntN(6) {
		case 0:
			rec.ProcessedAt = time.Unix(0, r.Int64()) // any time in int64 nanoseconds
		case 1:
			rec.ProcessedAt = time.Unix(r.Int64N(1<<40)-1<<39, r.Int64N(1e9)) // ±17,000 years
		case 2:
			// zero
		default:
			rec.ProcessedAt = encodingAt.Add(time.Duration(r.Int64N(int64(200 * time.Hour))))
		}
		rec.EventType = randomType(r)
		if r.IntN(4) == 0 {
			rec.EventID = randomType(r)
		}
		fp := make([]byte, 16)
		for i := range fp {
			fp[i] = byte(r.Uint32())
		}
		switch r.IntN(6) {
		case 0:
		case 1:
			rec.Fingerprint = strings.ToUpper(hex.EncodeToString(fp))
		case 2:
			rec.Fingerprint = hex.EncodeToString(fp[:r.IntN(16)])
		case 3:
			rec.Fingerprint = randomType(r)
		default:
			rec.Fingerprint = hex.EncodeToString(fp)
		}
		exp := unixNano(encodingAt.Add(time.Duration(r.Int64N(int64(100 * time.Hour)))))
		if r.IntN(10) == 0 {
			exp = r.Uint64()
		}
		if checkRoundTrip(t, rec, exp)[0] == recordV2 {
			v2++
		}
	}
	if v2 < n/4 {
		t.Errorf("only %d of %d random records compact", v2, n)
	}
}

// TestDecodeRecordDamaged: a truncated or damaged value is an error, not
// a panic nor a wrong record.
func TestDecodeRecordDamaged(t *testing.T) {
	exp := unixNano(encodingAt.Add(72 * time.Hour))
	raw := newDoneValue(dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded", Fingerprint: encodingFP}).encode(exp)
	for i := range len(raw) - 1 {
		if _, v, err := decodeRecord(raw[:i]); err == nil {
			t.Errorf("truncated to %d bytes: read %q", i, v)
		}
		if _, v, err := decodeAnswer(raw[:i]); err == nil {
			t.Errorf("truncated to %d bytes: answered %q", i, v)
		}
	}
	bad := append([]byte(nil), raw...)
	bad[0] = 3
	if _, _, err := decodeRecord(bad); err == nil {
		t.Error("version 3 read")
	}
	// A processed_at delta that puts the time before 1970.
	neg := append(raw[:9:9], 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)
	if _, v, err := decodeRecord(append(neg, raw[16:]...)); err == nil {
		t.Errorf("processed_at out of range read as %q", v)
	}
}

// FuzzDecodeRecord: no value on disk makes the reader panic, and what it
// reads as a done record is one.
func FuzzDecodeRecord(f *testing.F) {
	exp := unixNano(encodingAt.Add(72 * time.Hour))
	f.Add(newDoneValue(dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded", Fingerprint: encodingFP}).encode(exp))
	f.Add(newDoneValue(dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "invoice.paid", Fingerprint: "x0123456789abcdef"}).encode(exp))
	f.Add(encodeRecord(exp, "inflight:tok"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, a, aerr := decodeAnswer(raw)
		_, v, err := decodeRecord(raw)
		if (aerr == nil) != (err == nil) {
			t.Fatalf("decodeAnswer %q, %v; decodeRecord %q, %v", a, aerr, v, err)
		}
		if r1, ok1 := dedup.DecodeDone(a); err == nil && ok1 {
			r2, _ := dedup.DecodeDone(v)
			r2.ProcessedAt = r2.ProcessedAt.Truncate(time.Millisecond)
			r1.ProcessedAt = r1.ProcessedAt.Truncate(time.Millisecond)
			// (compared as JSON: it writes invalid UTF-8 as U+FFFD, the
			// compact form keeps the bytes as written)
			r1, _ = dedup.DecodeDone(r1.Encode())
			if r1 != r2 {
				t.Fatalf("answer %q (%#v) is not the record %q (%#v)", a, r1, v, r2)
			}
		}
		if err == nil && len(raw) > 0 && (raw[0] == recordV2 || raw[0] == recordV3) {
			if _, ok := dedup.DecodeDone(v); !ok {
				t.Fatalf("record version %d read as %q", raw[0], v)
			}
		}
	})
}

// TestFileStoreReadsBothRecordVersions: through the store's API, a done
// record written in recordV1 (by the layout before recordV2) and one
// committed now (recordV2) give the same answers: the claim's value (the
// same record, in dedup's compact form for recordV2), Get,
// Forget, a retried commit, and the sweeper deletes both when they expire.
func TestFileStoreReadsBothRecordVersions(t *testing.T) {
	ctx := context.Background()
	clock := testclock.New()
	st := openTestShared(t, filepath.Join(t.TempDir(), "dedup.db"), clock.Now)
	s := &Store{state: st}
	records := map[string]dedup.DoneRecord{}
	for i, typ := range []string{"payment_intent.succeeded", "", `a"b\c`, "支付.🎉", "a\xffb"} {
		records[fmt.Sprintf("k%d", i)] = dedup.DoneRecord{ProcessedAt: clock.Now().Add(-time.Duration(i) * time.Millisecond), EventType: typ, Fingerprint: encodingFP}
	}
	// v1 keys written as the previous layout wrote them, straight to Pebble.
	b := st.db.NewBatch()
	for k, rec := range records {
		exp := unixNano(clock.Now().Add(time.Hour))
		if err := b.Set(doneKey("v1"+k), encodeRecord(exp, rec.Encode()), nil); err != nil {
			t.Fatal(err)
		}
		if err := b.Set(oldExpiryKey(exp, "v1"+k), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for k, rec := range records {
		if res, _, err := s.Claim(ctx, "v2"+k, "tok", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim %s: %v %v", k, res, err)
		}
		if _, err := s.Commit(ctx, "v2"+k, "tok", rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for k, rec := range records {
		want := rec.Encode()
		for _, v := range []string{"v1", "v2"} {
			raw, _, _ := st.get(doneKey(v + k))
			if wantVer := map[string]byte{"v1": recordV1, "v2": recordV2}[v]; raw[0] != wantVer {
				t.Errorf("%s%s on disk as version %d, want %d", v, k, raw[0], wantVer)
			}
			// A claim answers a compact record (recordV2) in dedup's
			// compact form, without JSON; the JSON one (recordV1) as it is.
			claimWant := map[string]string{"v1": want, "v2": rec.EncodeCompact()}[v]
			res, val, err := s.Claim(ctx, v+k, "other", time.Minute)
			if err != nil || res != dedup.AlreadyDone || val != claimWant || dedup.Fingerprint(val) != encodingFP {
				t.Errorf("claim %s%s: %v %q %v; want done %q", v, k, res, val, err, claimWant)
			}
			if e, err := s.Get(ctx, v+k); err != nil || e.Value != want {
				t.Errorf("get %s%s: %q %v", v, k, e.Value, err)
			}
		}
		// A retried commit of the same record is recognised.
		if again, err := s.Commit(ctx, "v2"+k, "tok", rec, time.Hour); err != nil || !again {
			t.Errorf("retried commit %s: %v %v", k, again, err)
		}
	}
	// Forget one of each.
	for _, v := range []string{"v1", "v2"} {
		e, ok, err := s.Forget(ctx, v+"k3", false)
		if err != nil || !ok || e.Value != records["k3"].Encode() {
			t.Errorf("forget %sk3: %q %v %v", v, e.Value, ok, err)
		}
	}
	clock.Advance(2 * time.Hour)
	if _, err := st.sweep(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Entries(); err != nil || n != 0 {
		t.Errorf("after the sweep: %d records, %v; want 0", n, err)
	}
}

// BenchmarkDoneRecord: the CPU a commit spends on its done record's
// value (JSON: rec.Encode() behind the version and expiry, recordV1;
// compact: the same string, the recordV2 body and its round-trip check,
// recordV2), and what reading it back costs: as the "done:{...}" string
// (read: Get), and as a duplicate's claim answers (claim: decodeAnswer,
// dedup's compact form for the handler's own records, which have no
// event ID; JSON for the others, such as BenchRecord's with an event ID).
//
//	go test -run '^$' -bench BenchmarkDoneRecord -benchmem -count 5 ./stores/file
func BenchmarkDoneRecord(b *testing.B) {
	rec := BenchRecord("sangho_dedup:evt_3MtwBwLkdIwHu7ix28a3tqPa", encodingAt)
	handlerRec := dedup.DoneRecord{ProcessedAt: encodingAt, EventType: "payment_intent.succeeded", Fingerprint: "x0123456789abcdef"}
	exp := unixNano(encodingAt.Add(72 * time.Hour))
	b.Run("commit/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = encodeRecord(exp, rec.Encode())
		}
	})
	b.Run("commit/compact", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = newDoneValue(rec).encode(exp)
		}
	})
	for _, f := range []struct {
		name string
		raw  []byte
	}{{"json", encodeRecord(exp, rec.Encode())}, {"compact", newDoneValue(rec).encode(exp)},
		// the handler's own record of an event: no event ID, xxh64
		{"compact-handler", newDoneValue(handlerRec).encode(exp)}} {
		b.Run("read/"+f.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ReportMetric(float64(len(f.raw)), "value-bytes")
			for b.Loop() {
				if _, _, err := decodeRecord(f.raw); err != nil {
					b.Fatal(err)
				}
			}
		})
		// a duplicate's claim: decodeAnswer
		b.Run("claim/"+f.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := decodeAnswer(f.raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
