package sanghodedup

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/promreg"
)

// Outcomes of a delivery: the values of {http.sangho_dedup.outcome} and
// of the outcome label of caddy_sangho_dedup_events_total.
const (
	outcomeProcessed = "processed"
	// processed_marked: processed (2xx) after being passed on with
	// Sangho-Dedup-Prior-Attempt: unknown, the event's earlier attempt
	// having an unknown fate (dedup.Reclaimed).
	outcomeProcessedMarked  = "processed_marked"
	outcomeDuplicate        = "duplicate"
	outcomeInFlight         = "in_flight"
	outcomeInvalidSignature = "invalid_signature"
	outcomeBadRequest       = "bad_request"
	outcomeTooLarge         = "too_large"
	outcomeStoreError       = "store_error"
	outcomeUnchecked        = "unchecked"
	outcomeReleased         = "released"
	outcomeHeld             = "held"
	outcomePayloadMismatch  = "payload_mismatch"
)

var allOutcomes = []string{
	outcomeProcessed, outcomeProcessedMarked, outcomeDuplicate, outcomeInFlight, outcomeInvalidSignature,
	outcomeBadRequest, outcomeTooLarge, outcomeStoreError, outcomeUnchecked, outcomeReleased, outcomeHeld,
	outcomePayloadMismatch,
}

// dedup.Store operations, the op label of the latency histogram.
const (
	opClaim   = "claim"
	opRenew   = "renew"
	opCommit  = "commit"
	opRelease = "release"
)

// Why a signature was refused: the reason label of
// caddy_sangho_dedup_signature_failures_total (see sigFailureReason).
var sigReasons = []string{"missing", "malformed", "timestamp", "mismatch", "replayed", "other"}

// The collectors are created once per process and registered with the
// registry of every config that provisions the handler, so their counts
// survive config reloads. No label ever holds an event ID: the endpoint
// label is the handler's name (config, not traffic).
var metrics = struct {
	events        *prometheus.CounterVec
	storeOps      *prometheus.HistogramVec
	leaseLost     prometheus.Counter
	commitErr     prometheus.Counter
	sigFailures   *prometheus.CounterVec
	inFlight      prometheus.Gauge
	commitPending prometheus.GaugeFunc

	sigReason map[string]prometheus.Counter
}{
	events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "events_total",
		Help: "Webhook deliveries handled by sangho_dedup, by endpoint (the handler's name) and outcome.",
	}, []string{"endpoint", "outcome"}),
	storeOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "store_operation_duration_seconds",
		Help:    "Latency of dedup store operations, by operation and result (ok or error).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op", "result"}),
	leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "lease_lost_total",
		Help: "In-flight leases found taken over or expired while the backend was still working.",
	}),
	commitErr: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "commit_errors_total",
		Help: "Events the backend processed (2xx) whose done record could not be written.",
	}),
	sigFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "signature_failures_total",
		Help: "Deliveries refused for their signature (outcome invalid_signature), by reason.",
	}, []string{"reason"}),
	inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "events_in_flight",
		Help: "Events this process has claimed and passed on, not yet settled (committed, released or held).",
	}),
	commitPending: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "commit_retries_pending",
		Help: "Processed events whose done record failed and is being retried in the background.",
	}, func() float64 { return float64(pendingCommits.Load()) }),
}

// observers are the histogram children, looked up once.
var observers = map[string][2]prometheus.Observer{}

func init() {
	for _, op := range []string{opClaim, opRenew, opCommit, opRelease} {
		observers[op] = [2]prometheus.Observer{
			metrics.storeOps.WithLabelValues(op, "ok"),
			metrics.storeOps.WithLabelValues(op, "error"),
		}
	}
	metrics.sigReason = make(map[string]prometheus.Counter, len(sigReasons))
	for _, r := range sigReasons {
		metrics.sigReason[r] = metrics.sigFailures.WithLabelValues(r)
	}
}

// outcomeCounters returns the children of caddy_sangho_dedup_events_total
// of one endpoint, by outcome: a handler looks them up once, at provision.
func outcomeCounters(endpoint string) map[string]prometheus.Counter {
	m := make(map[string]prometheus.Counter, len(allOutcomes))
	for _, o := range allOutcomes {
		m[o] = metrics.events.WithLabelValues(endpoint, o)
	}
	return m
}

// sigFailureReason names why a signature was refused: the provider's
// error wraps one of dedup's ErrSignature* reasons.
func sigFailureReason(err error) string {
	switch {
	case errors.Is(err, dedup.ErrSignatureMissing):
		return "missing"
	case errors.Is(err, dedup.ErrSignatureMalformed):
		return "malformed"
	case errors.Is(err, dedup.ErrSignatureTimestamp):
		return "timestamp"
	case errors.Is(err, dedup.ErrSignatureMismatch):
		return "mismatch"
	case errors.Is(err, errSigReplayed):
		return "replayed"
	}
	return "other"
}

// allCollectors are the collectors registerMetrics registers.
func allCollectors() []prometheus.Collector {
	return []prometheus.Collector{metrics.events, metrics.storeOps, metrics.leaseLost, metrics.commitErr,
		metrics.sigFailures, metrics.inFlight, metrics.commitPending}
}

// registerMetrics adds the collectors to a config's registry; a
// collector already there (a reload) is fine.
func registerMetrics(reg prometheus.Registerer) error {
	return promreg.Register(reg, allCollectors()...)
}

func observe(op string, start time.Time, err error) {
	i := 0
	if err != nil {
		i = 1
	}
	observers[op][i].Observe(time.Since(start).Seconds())
}
