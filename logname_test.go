package sanghodedup

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// TestLogLinesNameTheirEndpoint: with two endpoints on one server, a
// handler's log lines say which one they are about (its name): with one
// wrong secret, the two "signatures rejected" warnings were identical
// (found by the configuration review). Each line names its endpoint, at
// load and at request time.
func TestLogLinesNameTheirEndpoint(t *testing.T) {
	l := ledger.New(t)
	s := startCaddyLogging(t, "\thandle /orders {\n\t\tsangho_dedup {\n\t\t\tsecret whsec_other\n\t\t\tname orders\n\t\t\tkey_prefix orders:\n\t\t\tretention 24h\n\t\t\tstore memory\n\t\t}\n\t\treverse_proxy "+l.Addr+"\n\t}\n"+
		"\thandle /webhook {\n\t\tsangho_dedup {\n\t\t\tsecret "+secret1+"\n\t\t\tname payments\n\t\t\tkey_prefix payments:\n\t\t\tstore memory\n\t\t}\n\t\treverse_proxy "+l.Addr+"\n\t}\n")
	for _, url := range []string{"http://127.0.0.1:" + strconv.Itoa(s.port) + "/orders", s.url} {
		// orders has another secret; payments gets a signature of
		// another body.
		body := eventBody("evt_logname")
		if url == s.url {
			body = eventBody("evt_logname_x")
		}
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(eventBody("evt_logname")))
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret1))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s, a delivery that is not signed right: %d, want 401", url, resp.StatusCode)
		}
	}
	entries, text := logEntries(t, s.logFile)
	want := map[string]bool{"signatures rejected orders": true, "signatures rejected payments": true, "retention shorter than redelivery window orders": true}
	for _, e := range entries {
		msg, _ := e["msg"].(string)
		name, _ := e["name"].(string)
		if e["logger"] == "http.handlers.sangho_dedup" && (msg == "signatures rejected" || msg == "retention shorter than redelivery window") {
			if !want[msg+" "+name] {
				t.Errorf("%q: name %q, unexpected", msg, name)
			}
			delete(want, msg+" "+name)
		}
	}
	for msg := range want {
		t.Errorf("no line %q in the log:\n%s", msg, text)
	}
}
