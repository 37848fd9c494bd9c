package sanghodedup

import (
	"net/http"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

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
