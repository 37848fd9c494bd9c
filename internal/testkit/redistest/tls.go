package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"strconv"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// TLSServerName is the only name in the server certificate of
// GenerateTLS: it holds no IP address, so a client that dials 127.0.0.1
// must be told this name (tls_server_name) to verify it.
const TLSServerName = "redis.test"

// TLSFiles are PEM files made by GenerateTLS in a test's temporary
// directory: a CA, a server certificate and a client certificate that it
// signed, and an unrelated CA that signed nothing Redis presents.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	// OtherCA is a CA that signed nothing here: trusting it alone must
	// fail.
	OtherCA string
	// OtherClientCert and OtherClientKey: a client certificate signed by
	// OtherCA, which a server that trusts CA must refuse.
	OtherClientCert, OtherClientKey string

	caCert *x509.Certificate
}

// ClientConfig is a TLS configuration that trusts CA, presents the client
// certificate and verifies TLSServerName: what redistest's own clients use.
func (f *TLSFiles) ClientConfig(t testing.TB) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatalf("loading the test client certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(f.caCert)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: TLSServerName, MinVersion: tls.VersionTLS12}
}

// GenerateTLS makes the certificates of TLSFiles (ECDSA P-256, valid for
// an hour) with crypto/x509.
func GenerateTLS(t testing.TB) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	f := &TLSFiles{}
	ca, caKey := netkit.NewCA(t, "redistest CA")
	f.caCert = ca
	f.CA = netkit.WritePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	other, otherKey := netkit.NewCA(t, "redistest other CA")
	f.OtherCA = netkit.WritePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)

	f.ServerCert, f.ServerKey = netkit.Leaf(t, dir, "server", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: TLSServerName},
		DNSNames:    []string{TLSServerName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	f.ClientCert, f.ClientKey = netkit.Leaf(t, dir, "client", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "caddy"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	f.OtherClientCert, f.OtherClientKey = netkit.Leaf(t, dir, "other-client", other, otherKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "stranger"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return f
}

// StartTLS starts a redis-server that speaks TLS only (--port 0) on a
// free loopback port, with the server certificate of files; with
// authClients it requires a client certificate signed by files.CA
// (--tls-auth-clients yes). The test's cleanup stops it.
func StartTLS(t testing.TB, files *TLSFiles, authClients bool, extra ...string) *Server {
	t.Helper()
	auth := "no"
	if authClients {
		auth = "yes"
	}
	s := newServer(t, Bin(t, "redis-server"), t.TempDir())
	s.args = append(s.args, "--port", "0", "--tls-port", strconv.Itoa(s.Port),
		"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey,
		"--tls-ca-cert-file", files.CA, "--tls-auth-clients", auth)
	s.args = append(s.args, extra...)
	s.TLS = files.ClientConfig(t)
	s.Restart(t)
	t.Cleanup(s.Kill)
	return s
}
