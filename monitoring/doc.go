// Package monitoring holds what an operator drops into Prometheus and
// Grafana for caddy-sangho-dedup — the alerting rules
// (sangho-dedup.rules.yml, unit-tested by sangho-dedup.rules.test.yml),
// the dashboard (dashboard.json) and pictures of its panels (panels/) —
// and the tests that prove them against a real Caddy and a real
// Prometheus. It has no Go code of its own; see README.md here.
package monitoring
