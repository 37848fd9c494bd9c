package redis

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
)

// tlsOptions returns the names of the tls_* options that are set, in the
// order of the Caddyfile syntax; each implies TLS.
func (s *Store) tlsOptions() []string {
	var names []string
	if s.TLSTrustPoolRaw != nil {
		names = append(names, "tls_trust_pool")
	}
	if s.TLSClientCertificateFile != "" || s.TLSClientCertificateKeyFile != "" {
		names = append(names, "tls_client_auth")
	}
	if s.TLSServerName != "" {
		names = append(names, "tls_server_name")
	}
	if s.TLSInsecureSkipVerify {
		names = append(names, "tls_insecure_skip_verify")
	}
	return names
}

// tlsConfig builds the client TLS configuration from the tls_* options
// (placeholders resolved by resolve), with skipVerify from a url's
// skip_verify, and returns with it what identifies it for the
// shared-client key: the server name, whether verification is off, and
// digests of the trusted certificates and of the client certificate
// (digests only: the key never holds a secret in clear, nor do errors).
func (s *Store) tlsConfig(ctx caddy.Context, resolve func(option, v string) string, skipVerify bool) (*tls.Config, map[string]any, error) {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Empty: each connection verifies the host it dials (every node
		// of a Cluster its own).
		ServerName:         resolve("tls_server_name", s.TLSServerName),
		InsecureSkipVerify: s.TLSInsecureSkipVerify || skipVerify,
	}
	id := map[string]any{"server_name": cfg.ServerName, "insecure": cfg.InsecureSkipVerify, "roots": "system"}

	if s.TLSTrustPoolRaw != nil {
		raw := sha256.Sum256(s.TLSTrustPoolRaw) // LoadModule clears the field
		mod, err := ctx.LoadModule(s, "TLSTrustPoolRaw")
		if err != nil {
			return nil, nil, fmt.Errorf("tls_trust_pool: %v", err)
		}
		ca, ok := mod.(caddytls.CA)
		if !ok {
			return nil, nil, fmt.Errorf("tls_trust_pool: module %T is not a certificate pool (tls.ca_pool.source)", mod)
		}
		cfg.RootCAs = ca.CertPool()
		if cfg.RootCAs == nil {
			return nil, nil, errors.New("tls_trust_pool: the pool holds no certificate")
		}
		// The certificates themselves where the module shows them, so
		// that a reload with a changed CA file gets a new client.
		if cp, ok := mod.(caddytls.CertificateProvider); ok {
			h := sha256.New()
			for _, c := range cp.Certificates() {
				h.Write(c.Raw)
			}
			id["roots"] = "certs:" + hex.EncodeToString(h.Sum(nil))
		} else {
			id["roots"] = "config:" + hex.EncodeToString(raw[:])
		}
	}

	certFile, keyFile := resolve("tls_client_auth", s.TLSClientCertificateFile), resolve("tls_client_auth", s.TLSClientCertificateKeyFile)
	if (certFile == "") != (keyFile == "") {
		return nil, nil, errors.New("tls_client_auth: needs both a certificate file and a key file")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("tls_client_auth: loading the certificate and key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		h := sha256.New()
		for _, der := range cert.Certificate {
			h.Write(der)
		}
		id["client_cert"] = hex.EncodeToString(h.Sum(nil))
	}
	return cfg, id, nil
}
