// Package providers holds the signature providers of sangho_dedup, each a
// Caddy module in the namespace http.sangho_dedup.providers that
// implements dedup.Provider: sangho (Sangho's own signature), stripe,
// standard_webhooks (Standard Webhooks, e.g. Svix), github, shopify, and
// hmac (a generic HMAC over a template of the request). A provider checks
// a delivery's signature against the raw body and says where its event ID
// is (the body's "id" or a signed header); the handler does the rest.
// Each file registers its modules in init; the root package imports this
// package, so a Caddy built with the plugin has them all.
package providers
