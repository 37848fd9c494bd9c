package sanghodedup

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a delivery: the values of {http.sangho_dedup.outcome} and
// of the outcome label of caddy_sangho_dedup_events_total.
const (
	outcomeProcessed        = "processed"
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
	outcomeProcessed, outcomeDuplicate, outcomeInFlight, outcomeInvalidSignature,
	outcomeBadRequest, outcomeTooLarge, outcomeStoreError, outcomeUnchecked, outcomeReleased, outcomeHeld,
	outcomePayloadMismatch,
}

// Store operations, the op label of the latency histogram.
const (
	opClaim   = "claim"
	opRenew   = "renew"
	opCommit  = "commit"
	opRelease = "release"
)

// The collectors are created once per process and registered with the
// registry of every config that provisions the handler, so their counts
// survive config reloads. No label ever holds an event ID.
var metrics = struct {
	events       *prometheus.CounterVec
	storeOps     *prometheus.HistogramVec
	leaseLost    prometheus.Counter
	commitErr    prometheus.Counter
	unreplicated prometheus.Counter

	outcome map[string]prometheus.Counter
}{
	events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "events_total",
		Help: "Webhook deliveries handled by sangho_dedup, by outcome.",
	}, []string{"outcome"}),
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
	unreplicated: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "commit_unreplicated_total",
		Help: "Done records that fewer replicas than wait_replicas acknowledged in wait_timeout.",
	}),
}

// observers are the histogram children, looked up once.
var observers = map[string][2]prometheus.Observer{}

func init() {
	metrics.outcome = make(map[string]prometheus.Counter, len(allOutcomes))
	for _, o := range allOutcomes {
		metrics.outcome[o] = metrics.events.WithLabelValues(o)
	}
	for _, op := range []string{opClaim, opRenew, opCommit, opRelease} {
		observers[op] = [2]prometheus.Observer{
			metrics.storeOps.WithLabelValues(op, "ok"),
			metrics.storeOps.WithLabelValues(op, "error"),
		}
	}
}

// registerMetrics adds the collectors to a config's registry; a
// collector already there (a reload) is fine.
func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.events, metrics.storeOps, metrics.leaseLost, metrics.commitErr, metrics.unreplicated} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
