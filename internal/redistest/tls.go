package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
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
	ca, caKey := NewCA(t, "redistest CA")
	f.caCert = ca
	f.CA = WritePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	other, otherKey := NewCA(t, "redistest other CA")
	f.OtherCA = WritePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)

	f.ServerCert, f.ServerKey = Leaf(t, dir, "server", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: TLSServerName},
		DNSNames:    []string{TLSServerName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	f.ClientCert, f.ClientKey = Leaf(t, dir, "client", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "caddy"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	f.OtherClientCert, f.OtherClientKey = Leaf(t, dir, "other-client", other, otherKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "stranger"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return f
}

// nextSerial returns a random 128-bit serial number.
func nextSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err)
	}
	return n
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generating a key: %v", err)
	}
	return k
}

// NewCA makes a self-signed CA certificate named name (ECDSA P-256,
// valid for an hour), for the TLS tests of every server.
func NewCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("creating CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// Leaf signs tmpl with the CA (serial, an hour's validity and the key
// usage filled in) and writes the certificate and its key as PEM files
// <name>.pem and <name>-key.pem in dir.
func Leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = nextSerial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("creating certificate %s: %v", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return WritePEM(t, dir, name+".pem", "CERTIFICATE", der), WritePEM(t, dir, name+"-key.pem", "PRIVATE KEY", keyDER)
}

// WritePEM writes der as a PEM block of type typ to dir/name (0600).
func WritePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
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
