package sanghodedup

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// FuzzExtractEvent: never panics; an ID it returns is valid; on a body
// that starts with '{' it finds the body malformed exactly when
// encoding/json does; and on a body that encoding/json accepts as an
// object with a single top-level "id" (and no key encoding/json would
// also match to it, such as "ID"), it agrees with encoding/json.
func FuzzExtractEvent(f *testing.F) {
	f.Add(bodyA, "")
	f.Add(bodyB, "evt_unicode_body")
	f.Add(`{"id":"a","id":"b"}`, "")
	f.Add(`{"\u0069d":"evt_esc","data":{"id":"x"}}`, "")
	f.Add(`[1,2,{"id":"x"}]`, "evt_h")
	f.Add(`{"a":"\\\"","id":"e"}`, "e")
	f.Add(`{"a": nul, "id":"ev_1"}`, "")
	f.Add(`{"id":"evt_a","ID":"evt_b"}`, "")
	f.Add("\xef\xbb\xbf{\"id\":\"evt_bom\"}", "evt_h")
	f.Fuzz(func(t *testing.T, body, header string) {
		var headers []string
		if header != "" {
			headers = []string{header}
		}
		ev, err := extractEvent([]byte(body), headers, false)
		id := ev.id
		if err == nil && !validID(id) {
			t.Fatalf("returned invalid ID %q", id)
		}
		if strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "{") {
			_, scanErr := scanTopLevel([]byte(body))
			valid := json.Valid([]byte(body))
			if scanErr == nil && !valid {
				t.Fatalf("%q: accepted, but encoding/json finds it malformed", body)
			}
			if errors.Is(scanErr, errBodyJSON) && valid {
				t.Fatalf("%q: refused as malformed, but encoding/json accepts it", body)
			}
		}
		ids, variants, ok := topLevelIDKeys(body)
		if !ok || ids != 1 {
			return // not a JSON object, or no "id", or a duplicate one (refused)
		}
		if variants > 0 {
			if err == nil {
				t.Fatalf("%q: accepted with a key that encoding/json takes for \"id\"", body)
			}
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &obj) != nil {
			return
		}
		var want string
		if json.Unmarshal(obj["id"], &want) != nil || !validID(want) {
			return
		}
		if header != "" && header != want {
			if err != errIDMismatch {
				t.Fatalf("header %q, body id %q: err %v, want a mismatch", header, want, err)
			}
			return
		}
		if err != nil || id != want {
			t.Fatalf("body %q: got %q, %v; encoding/json says %q", body, id, err, want)
		}
	})
}

// topLevelIDKeys counts, with encoding/json's tokenizer, the top-level
// keys of a JSON object body that are "id" and those that are "id" in
// another case; ok is false if body is not a valid JSON object.
func topLevelIDKeys(body string) (ids, variants int, ok bool) {
	dec := json.NewDecoder(strings.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, 0, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, false
		}
		key, _ := tok.(string)
		switch {
		case key == "id":
			ids++
		case strings.EqualFold(key, "id"):
			variants++
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return 0, 0, false
		}
	}
	if _, err := dec.Token(); err != nil {
		return 0, 0, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, 0, false // something after the object
	}
	return ids, variants, true
}

// FuzzHandler: the whole handler (memory store) on arbitrary requests,
// signed or not: it never panics, answers only documented statuses, and
// passes on only requests with a valid signature and a valid event ID.
func FuzzHandler(f *testing.F) {
	f.Add("POST", bodyA, "", true)
	f.Add("POST", bodyA, "evt_other", true)
	f.Add("POST", `{"id":"x y"}`, "", true)
	f.Add("GET", bodyA, "", true)
	f.Add("POST", bodyA, "", false)
	f.Add("POST", strings.Repeat("[", 5000), "evt_h", true)
	h, _ := newTestHandler(f, func(h *Handler) { h.MaxBodySize = 4096 })
	allowed := map[int]bool{200: true, 400: true, 401: true, 405: true, 409: true, 413: true}
	f.Fuzz(func(t *testing.T, method, body, headerID string, sign bool) {
		if !validMethod(method) {
			return
		}
		r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
		r.Method = method
		if headerID != "" {
			r.Header["Sangho-Event-Id"] = []string{headerID}
		}
		if sign {
			r.Header.Set("Sangho-Signature", sangho.Sign(testNow, []byte(body), secret1))
		}
		reached := false
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			reached = true
			w.WriteHeader(500) // released: the fuzzer may send the same event again
			return nil
		})
		w, _, _ := serve(h, r, next)
		if !allowed[w.Code] && !(reached && w.Code == 500) {
			t.Fatalf("undocumented status %d", w.Code)
		}
		if reached {
			if !sign || method != http.MethodPost || len(body) > 4096 {
				t.Fatalf("passed on: method %q, signed %v, %d bytes", method, sign, len(body))
			}
			if _, err := extractEvent([]byte(body), r.Header.Values("Sangho-Event-Id"), true); err != nil {
				t.Fatalf("passed on a request whose event ID is refused: %v", err)
			}
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}
