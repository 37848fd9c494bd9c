package sanghodedup

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

// TestNestedHandlersLoseNothing: a request that passes through two
// sangho_dedup handlers (a snippet imported at the site's level and
// again in a handle, overlapping matchers) cannot be processed right:
// the inner one saw the outer one's own lease and answered 409 for ever,
// nothing logged, until the sender gave up (found by the configuration
// review). Now the inner one refuses it, 500 and an error line that says
// what to fix, and the outer one releases the event, so that the
// sender's retry is processed once the config is fixed: once.
func TestNestedHandlersLoseNothing(t *testing.T) {
	l := ledger.New(t)
	dedup := "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t\tstore memory\n\t}\n"
	nested := dedup + "\thandle /webhook {\n" + dedup + "\t\treverse_proxy " + l.Addr + "\n\t}\n"
	s := startCaddyLogging(t, nested)
	for i := range 2 {
		if a := send(t, s.url, eventBody("evt_nested"), "evt_nested"); a.status != http.StatusInternalServerError {
			t.Errorf("delivery %d through two sangho_dedup handlers: %d %q (Sangho-Dedup %q), want 500", i+1, a.status, a.body, a.dedup)
		}
	}
	if got, _ := l.Counts("evt_nested"); got != 0 {
		t.Errorf("the backend got the event %d times through nested handlers, want 0", got)
	}
	_, text := logEntries(t, s.logFile)
	if !strings.Contains(text, "sangho_dedup twice on one request") {
		t.Errorf("no error line names the nested handlers; log:\n%s", text)
	}
	// Fixed, the event is processed, once: it was released, not held.
	s.load(t, dedup+"\treverse_proxy "+l.Addr+"\n")
	for i := range 2 {
		a := send(t, s.url, eventBody("evt_nested"), "evt_nested")
		if want := []string{"", "duplicate"}[i]; a.status != http.StatusOK || a.dedup != want {
			t.Errorf("after the fix, delivery %d: %d %q (Sangho-Dedup %q), want 200 %q", i+1, a.status, a.body, a.dedup, want)
		}
	}
	if _, done := l.Counts("evt_nested"); done != 1 {
		t.Errorf("the backend processed the event %d times, want 1", done)
	}
}

// TestNestedAfterTheBackendIsHeld: a second sangho_dedup reached after the backend answered (in a
// reverse_proxy handle_response route) returns errNested; the outer one
// takes it for "never forwarded" and releases an event the backend
// processed: the retry was processed again (found by the review of
// the nested-handler change). Held instead: the retry waits lock_ttl.
func TestNestedAfterTheBackendIsHeld(t *testing.T) {
	l := ledger.New(t)
	dedup := "sangho_dedup {\n\t\tsecret " + secret1 + "\n\t\tstore memory\n\t}\n"
	site := "\t" + dedup + "\treverse_proxy " + l.Addr + " {\n\t\t@ok status 2xx\n\t\thandle_response @ok {\n\t\t\troute {\n\t\t\t\t" + dedup + "\t\t\t\trespond \"ok\" 200\n\t\t\t}\n\t\t}\n\t}\n"
	s := startCaddyLogging(t, site)
	for i := range 2 {
		a := send(t, s.url, eventBody("evt_nested_after"), "evt_nested_after")
		t.Logf("delivery %d: %d %q", i+1, a.status, a.dedup)
		if a.status == http.StatusOK {
			break
		}
	}
	if _, done := l.Counts("evt_nested_after"); done > 1 {
		t.Errorf("the backend processed the event %d times, want at most 1", done)
	}
}
