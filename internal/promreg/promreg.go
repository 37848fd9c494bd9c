// Package promreg registers process-wide collectors with the metrics
// registry of every config that needs them, so that their counts
// survive config reloads.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register adds cs to reg; a collector already there (a reload) is
// fine, and a nil reg (no metrics) does nothing.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
