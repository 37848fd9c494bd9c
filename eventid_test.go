package sanghodedup

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

func TestExtractEvent(t *testing.T) {
	long := strings.Repeat("a", 255)
	cases := []struct {
		name    string
		body    string
		headers []string
		id, typ string
		err     error
	}{
		{"contract body A", bodyA, nil, "evt_1QZtest000000000001", "payment_intent.succeeded", nil},
		{"contract body B, header equal", bodyB, []string{"evt_unicode_body"}, "evt_unicode_body", "customer.updated", nil},
		{"header only, body has no id", `{"type":"x"}`, []string{"evt_h"}, "evt_h", "x", nil},
		{"header only, body not JSON", `hello`, []string{"evt_h"}, "evt_h", "", nil},
		{"header only, body an array", `[{"id":"evt_b"}]`, []string{"evt_h"}, "evt_h", "", nil},
		{"header only, empty body", ``, []string{"evt_h"}, "evt_h", "", nil},
		{"body and header differ", bodyA, []string{"evt_other"}, "", "", errIDMismatch},
		{"an empty header counts as none", bodyA, []string{""}, "evt_1QZtest000000000001", "payment_intent.succeeded", nil},
		{"no id anywhere", `{"type":"x"}`, nil, "", "", errIDMissing},
		{"no id, not JSON", `nope`, nil, "", "", errIDMissing},
		{"nested id is not the event id", `{"data":{"id":"evt_nested"}}`, nil, "", "", errIDMissing},
		{"id inside a string is not a key", `{"note":"\"id\":\"evt_fake\"","id":"evt_real"}`, nil, "evt_real", "", nil},
		{"nested id then top-level id", `{"data":{"object":{"id":"pi_1"}},"id":"evt_top"}`, nil, "evt_top", "", nil},
		{"escaped key", `{"\u0069d":"evt_esc"}`, nil, "evt_esc", "", nil},
		{"escaped value", `{"id":"evt\u005fesc"}`, nil, "evt_esc", "", nil},
		{"whitespace everywhere", " \n{ \"id\" :\t\"evt_ws\" ,\r\n\"type\":\"t\" } \n", nil, "evt_ws", "t", nil},
		{"duplicate id keys", `{"id":"a","id":"b"}`, nil, "", "", errIDDupKey},
		{"duplicate equal id keys", `{"id":"a","id":"a"}`, nil, "", "", errIDDupKey},
		{"id is a number", `{"id":12}`, nil, "", "", errIDNotString},
		{"id is null", `{"id":null}`, []string{"evt_h"}, "", "", errIDNotString},
		{"id is an object", `{"id":{"x":1}}`, nil, "", "", errIDNotString},
		{"id empty", `{"id":""}`, nil, "", "", errIDInvalid},
		{"id 255 chars", `{"id":"` + long + `"}`, nil, long, "", nil},
		{"id 256 chars", `{"id":"` + long + `a"}`, nil, "", "", errIDInvalid},
		{"id with a space", `{"id":"evt 1"}`, nil, "", "", errIDInvalid},
		{"id with a colon", `{"id":"evt:1"}`, nil, "", "", errIDInvalid},
		{"id non-ASCII", `{"id":"évt"}`, nil, "", "", errIDInvalid},
		{"header id invalid", `{}`, []string{"evt/../x"}, "", "", errIDInvalid},
		{"header id 256", `{}`, []string{long + "a"}, "", "", errIDInvalid},
		{"two header ids", `{}`, []string{"a", "b"}, "", "", errIDHeaders},
		{"type not a string is ignored", `{"id":"e","type":7}`, nil, "e", "", nil},
		{"truncated object", `{"id":"evt_1","data":{`, nil, "", "", errBodyJSON},
		{"truncated string", `{"id":"evt_1`, nil, "", "", errBodyJSON},
		{"trailing garbage", `{"id":"evt_1"} x`, nil, "", "", errBodyJSON},
		{"missing colon", `{"id" "evt_1"}`, nil, "", "", errBodyJSON},
		{"missing comma", `{"a":1 "id":"evt_1"}`, nil, "", "", errBodyJSON},
		{"unquoted key", `{id:"evt_1"}`, nil, "", "", errBodyJSON},
		{"trailing comma", `{"id":"evt_1",}`, nil, "", "", errBodyJSON},
		{"mismatched brackets", `{"a":[1,2},"id":"evt_1"}`, nil, "", "", errBodyJSON},
		{"control char in string", "{\"id\":\"evt\x01\"}", nil, "", "", errBodyJSON},
		{"non-UTF-8 elsewhere", "{\"x\":\"\xff\xfe\",\"id\":\"evt_1\"}", nil, "evt_1", "", nil},
		{"empty object", `{}`, nil, "", "", errIDMissing},
		{"deep nesting", `{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `,"id":"evt_deep"}`, nil, "evt_deep", "", nil},
		{"nesting deeper than encoding/json allows", `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `,"id":"evt_deep"}`, nil, "", "", errBodyJSON},
		{"empty nested at the limit", `{"a":` + strings.Repeat(`{"b":`, 9998) + `[]` + strings.Repeat("}", 9998) + `,"id":"evt_deep"}`, nil, "evt_deep", "", nil},
		{"empty nested past the limit", `{"a":` + strings.Repeat(`{"b":`, 9999) + `[]` + strings.Repeat("}", 9999) + `,"id":"evt_deep"}`, nil, "", "", errBodyJSON},
		// Scalars, nested or not, per JSON's grammar.
		{"literal misspelt", `{"a": nul, "id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"literal misspelt, nested", `{"a":[1,{"b":tru}],"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"literal with a tail", `{"a":nullx,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"literal run together", `{"a":[truefalse],"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"bare word", `{"a":undefined,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"number with a leading zero", `{"a":01,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"number ending in a dot", `{"a":1.,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"number starting with a dot", `{"a":.5,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"lone minus", `{"a":[-],"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"plus sign", `{"a":+1,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"exponent without digits", `{"a":1e+,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"hex number", `{"a":0x1F,"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"numbers that are fine", `{"a":[0,-0,1.5,-12.25e+3,6E-2,1e9],"id":"ev_1"}`, nil, "ev_1", "", nil},
		{"literals that are fine", `{"a":[true,false,null,{"x":null}],"id":"ev_1"}`, nil, "ev_1", "", nil},
		{"nested missing colon", `{"a":{"b" 1},"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"nested missing comma", `{"a":[1 2],"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"nested trailing comma", `{"a":[1,],"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"nested unquoted key", `{"a":{b:1},"id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"bad escape in a skipped string", `{"a":"\q","id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"short \\u escape", `{"a":"\u12","id":"ev_1"}`, nil, "", "", errBodyJSON},
		{"control char in a skipped string", "{\"a\":[\"x\ty\"],\"id\":\"ev_1\"}", nil, "", "", errBodyJSON},
		{"escapes that are fine", `{"a":"\"\\\/\b\f\n\r\t\u00e9\ud800","id":"ev_1"}`, nil, "ev_1", "", nil},
		// Keys that Go's encoding/json would take for "id".
		{"ID beside id", `{"id":"evt_a","ID":"evt_b"}`, nil, "", "", errIDCaseKey},
		{"ID before id", `{"ID":"evt_b","id":"evt_a"}`, nil, "", "", errIDCaseKey},
		{"Id alone", `{"Id":"evt_b"}`, []string{"evt_b"}, "", "", errIDCaseKey},
		{"iD, nested value", `{"iD":{"x":1},"id":"evt_a"}`, nil, "", "", errIDCaseKey},
		{"ID spelt with an escape", `{"id":"evt_a","\u0049D":"evt_b"}`, nil, "", "", errIDCaseKey},
		{"i\\u0044 spelt with an escape", `{"id":"evt_a","i\u0044":"evt_b"}`, nil, "", "", errIDCaseKey},
		{"dotted capital I is not a case of i", `{"id":"evt_a","\u0130d":"x","\u0131d":"y"}`, nil, "evt_a", "", nil},
		{"nested ID is not the event id", `{"id":"evt_a","data":{"ID":"x"}}`, nil, "evt_a", "", nil},
		{"Type key is no matter", `{"id":"evt_a","Type":"x"}`, nil, "evt_a", "", nil},
		// A byte order mark.
		{"BOM before the object", "\xef\xbb\xbf" + `{"id":"evt_bom"}`, nil, "", "", errBodyBOM},
		{"BOM, header ID", "\xef\xbb\xbf" + `{"id":"evt_bom"}`, []string{"evt_h"}, "", "", errBodyBOM},
		{"BOM, not JSON", "\xef\xbb\xbfhello", []string{"evt_h"}, "", "", errBodyBOM},
		{"BOM after whitespace is just not JSON", " \xef\xbb\xbf{}", []string{"evt_h"}, "evt_h", "", nil},
	}
	for _, c := range cases {
		sameScan(t, []byte(c.body)) // the scanner answers as it did before it was made faster
		ev, err := extractEvent([]byte(c.body), c.headers, false)
		if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.err)
			continue
		}
		if err == nil && (ev.id != c.id || ev.typ != c.typ) {
			t.Errorf("%s: id %q type %q, want %q %q", c.name, ev.id, ev.typ, c.id, c.typ)
		}
		// With require_body_id on, a body without a top-level "id" is
		// refused, and everything else is the same.
		wantErr, wantID := err, ev.id
		if f, scanErr := scanTopLevel([]byte(c.body)); len(c.headers) <= 1 && scanErr == nil && !f.hasID {
			wantErr, wantID = errIDNotInBody, ""
		}
		evOn, errOn := extractEvent([]byte(c.body), c.headers, true)
		if !errors.Is(errOn, wantErr) || (wantErr == nil && errOn != nil) || evOn.id != wantID {
			t.Errorf("%s, require_body_id on: %q %v, want %q %v", c.name, evOn.id, errOn, wantID, wantErr)
		}
	}
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "evt_1QZtest000000000001", "A-b_9", strings.Repeat("z", 255)} {
		if !validID(id) {
			t.Errorf("%q rejected", id)
		}
	}
	for _, id := range []string{"", strings.Repeat("z", 256), "a b", "a.b", "a\x00", "é", "a/b", "a*"} {
		if validID(id) {
			t.Errorf("%q accepted", id)
		}
	}
}

// extractEvent is extractEventField with the ID in "id", as Sangho sends it.
func extractEvent(body []byte, headerIDs []string, requireBodyID bool) (event, error) {
	return extractEventField(body, headerIDs, requireBodyID, "id", false)
}

// scanTopLevel is scanTopLevelKey with the ID in "id".
func scanTopLevel(b []byte) (topLevel, error) { return scanTopLevelKey(b, "id") }

// TestEventTypeCleanedBeforeItGoesAnywhere: an event's type is the
// sender's text, signed but otherwise anything JSON allows. A NUL
// ("\u0000") or a byte that is not UTF-8 in it made PostgreSQL refuse
// every commit of the processed event (invalid byte sequence for
// encoding "UTF8"): never recorded, its redeliveries passed on again,
// marked. A type of the whole body's size went into every record. The
// type is cleaned where it is read: invalid UTF-8 and control
// characters become U+FFFD, and it is cut at 255 bytes.
func TestEventTypeCleanedBeforeItGoesAnywhere(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	for _, c := range []struct{ name, raw, want string }{
		{"NUL, escaped", `"bad\u0000type"`, "bad\uFFFDtype"},
		{"control characters, escaped", `"a\nb\u001bc\u007f"`, "a\uFFFDb\uFFFDc\uFFFD"},
		{"a byte that is not UTF-8", "\"bad\xfftype\"", "bad\uFFFDtype"},
		{"over 255 bytes, cut between characters", `"` + long + `"`, strings.Repeat("é", 127)},
		{"bidi overrides and isolates, escaped", `"a\u202eb\u2066c\u200fd"`, "a\uFFFDb\uFFFDc\uFFFDd"},
		{"line and paragraph separators, raw", "\"a\u2028b\u2029c\"", "a\uFFFDb\uFFFDc"},
		{"zero-width characters and a BOM", `"a\u200bb\ufeffc"`, "a\uFFFDb\uFFFDc"},
		{"a usual type, as it is", `"payment_intent.succeeded"`, "payment_intent.succeeded"},
		{"letters of any script, as they are", `"paiement.réussi.決済"`, "paiement.réussi.決済"},
		{"zero-width joiners, part of words and emoji", `"\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.👩\u200d💻"`, "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.👩\u200d💻"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := newTestHandler(t, nil)
			body := `{"id":"evt_typed","type":` + c.raw + `}`
			w, repl, _ := serve(h, signedRequest(body, ""), &countingNext{})
			typ, _ := repl.GetString("http.sangho_dedup.event_type")
			if w.Code != 200 || outcomeOf(repl) != outcomeProcessed || typ != c.want {
				t.Fatalf("%d %s, event_type %q; want 200 processed, %q", w.Code, outcomeOf(repl), typ, c.want)
			}
			e, err := h.store.Get(t.Context(), h.KeyPrefix+"evt_typed")
			if err != nil {
				t.Fatal(err)
			}
			rec, ok := dedup.DecodeDone(e.Value)
			if !ok || rec.EventType != c.want || !utf8.ValidString(rec.EventType) || len(rec.EventType) > 255 {
				t.Fatalf("the record %q; want event_type %q", e.Value, c.want)
			}
		})
	}
}

// TestEventTypeWithANULIsRecordedInPostgres: the same on PostgreSQL,
// where a NUL in the type was refused at every commit.
func TestEventTypeWithANULIsRecordedInPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	store, _ := json.Marshal(map[string]any{"type": "postgres", "dsn": pg.DSN})
	h, _ := newTestHandler(t, func(h *Handler) { h.StoreRaw = store })
	body := `{"id":"evt_nul","type":"bad\u0000type"}`
	next := &countingNext{}
	for i, want := range []string{outcomeProcessed, outcomeDuplicate} {
		w, repl, _ := serve(h, signedRequest(body, ""), next)
		if w.Code != 200 || outcomeOf(repl) != want {
			t.Fatalf("delivery %d: %d %s; want 200 %s", i+1, w.Code, outcomeOf(repl), want)
		}
	}
	if n := next.calls.Load(); n != 1 {
		t.Fatalf("the backend received the event %d times, want 1", n)
	}
}

// BenchmarkCleanEventType: a usual type (printable ASCII) and one with
// letters of other scripts, which take the Unicode path.
func BenchmarkCleanEventType(b *testing.B) {
	for _, typ := range []string{"payment_intent.succeeded", "paiement.réussi.決済"} {
		b.Run(strconv.Itoa(len(typ))+"B", func(b *testing.B) {
			for b.Loop() {
				if cleanEventType(typ) != typ {
					b.Fatal("changed")
				}
			}
		})
	}
}

// TestIDFieldCaseVariantsInUTF8: a key that Go's encoding/json would
// match to the id_field is refused even when its case variant is longer
// in UTF-8 than the field (the Kelvin sign K folds to k, the long s ſ
// to s): {"key":"evt_a","Key":"evt_b"} is evt_b to a Go backend.
func TestIDFieldCaseVariantsInUTF8(t *testing.T) {
	for _, c := range []struct{ field, body string }{
		{"key", "{\"key\":\"evt_a\",\"\u212aey\":\"evt_b\"}"},
		{"key", "{\"\u212aEY\":\"evt_b\",\"key\":\"evt_a\"}"},
		{"sku", "{\"sku\":\"evt_a\",\"\u017f\u212au\":\"evt_b\"}"},
	} {
		for _, toID := range []bool{false, true} {
			_, err := extractEventField([]byte(c.body), nil, true, c.field, toID)
			if toID && err == nil {
				continue // read up to the ID only: the rest is readRest's
			}
			if !errors.Is(err, errIDCaseKey) {
				t.Errorf("id_field %s, %s (toID %v): %v, want errIDCaseKey", c.field, c.body, toID, err)
			}
		}
		if _, err := scanTopLevelKey([]byte(c.body), c.field); !errors.Is(err, errIDCaseKey) {
			t.Errorf("id_field %s, %s: %v, want errIDCaseKey", c.field, c.body, err)
		}
	}
}

// TestValidIDRefusesPunctuation: the bytes between 'Z' and 'a' in ASCII
// ([ \ ] ^ _ `) are not ID characters, '_' excepted.
func TestValidIDRefusesPunctuation(t *testing.T) {
	for _, id := range []string{"evt[1]", `evt\1`, "evt^1", "evt`1", "evt@1", "evt{1}", "evt.1"} {
		if validID(id) {
			t.Errorf("validID(%q) = true", id)
		}
	}
	if !validID("evt_1-Za") {
		t.Error(`validID("evt_1-Za") = false`)
	}
}

// TestIDKeyWrittenInEscapes: a key written wholly in \u escapes is the
// key it decodes to ("\u0069\u0064" is "id"): a second ID, or one in
// another case, is refused however it is spelled, and one alone is the ID.
func TestIDKeyWrittenInEscapes(t *testing.T) {
	for body, want := range map[string]error{
		`{"id":"evt_a","\u0069\u0064":"evt_b"}`: errIDDupKey,
		`{"\u0069\u0064":"evt_a","id":"evt_b"}`: errIDDupKey,
		`{"id":"evt_a","\u0049\u0044":"evt_b"}`: errIDCaseKey,
	} {
		if _, err := scanTopLevel([]byte(body)); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", body, err, want)
		}
	}
	ev, err := extractEvent([]byte(`{"\u0069\u0064":"evt_c","\u0074\u0079\u0070\u0065":"t"}`), []string{"evt_c"}, true)
	if err != nil || ev.id != "evt_c" || ev.typ != "t" {
		t.Errorf("escaped id and type: %q %q %v, want evt_c t", ev.id, ev.typ, err)
	}
}
