package sanghodedup

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/providers"
)

// TestSignatureFailureReasons: every refusal the providers return has a
// reason of its own in caddy_sangho_dedup_signature_failures_total, not
// "other", wrapped or not.
func TestSignatureFailureReasons(t *testing.T) {
	for err, want := range map[error]string{
		dedup.ErrSignatureMissing: "missing", dedup.ErrSignatureMalformed: "malformed", providers.ErrSignaturePrefix: "malformed",
		providers.ErrSignatureEncoding: "malformed", providers.ErrSignatureCount: "malformed", providers.ErrTooManySignatures: "malformed",
		dedup.ErrSignatureTimestamp: "timestamp", dedup.ErrSignatureMismatch: "mismatch", errSigReplayed: "replayed",
		fmt.Errorf("%w: Sangho-Signature", dedup.ErrSignatureMissing): "missing",
		errors.New("something else"):                                  "other",
	} {
		if got := sigFailureReason(err); got != want {
			t.Errorf("%v: reason %q, want %q", err, got, want)
		}
		if metrics.sigReason[want] == nil {
			t.Errorf("reason %q has no counter", want)
		}
	}
}

// TestEventsInFlightGauge: caddy_sangho_dedup_events_in_flight counts a
// delivery while the backend works on it, and not after.
func TestEventsInFlightGauge(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.KeyPrefix = "inflight:" })
	before := testutil.ToFloat64(metrics.inFlight)
	var during float64
	next := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		during = testutil.ToFloat64(metrics.inFlight)
		w.WriteHeader(http.StatusOK)
		return nil
	}}
	serve(h, signedRequest(eventBody("evt_inflight"), ""), next)
	if during-before != 1 {
		t.Errorf("while the backend worked: %v, want %v", during, before+1)
	}
	if after := testutil.ToFloat64(metrics.inFlight); after != before {
		t.Errorf("after: %v, want %v", after, before)
	}
}
