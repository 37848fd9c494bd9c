package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are a private CA, a server certificate it signed for
// localhost and 127.0.0.1, and a client certificate it signed whose
// common name is a database role (what clientcert=verify-full checks),
// as PEM files in a test's temporary directory; OtherCA signed nothing
// here.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey, OtherCA string
}

// GenerateTLS makes TLSFiles, the client certificate for role (ECDSA
// P-256, valid for an hour).
func GenerateTLS(t testing.TB, role string) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	f := &TLSFiles{}
	ca, caKey := newCA(t, "pgtest CA")
	f.CA = writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	other, _ := newCA(t, "pgtest other CA")
	f.OtherCA = writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	f.ServerCert, f.ServerKey = leaf(t, dir, "server", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	f.ClientCert, f.ClientKey = leaf(t, dir, "client", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: role},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return f
}

// ServerFiles are the files StartWith puts in the data directory and
// the settings that use them: TLS on, client certificates checked
// against the CA.
func (f *TLSFiles) ServerFiles(t testing.TB) (map[string][]byte, []string) {
	t.Helper()
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return map[string][]byte{
			"server.crt": read(f.ServerCert), "server.key": read(f.ServerKey), "root.crt": read(f.CA),
		}, []string{
			"ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'", "ssl_ca_file = 'root.crt'",
		}
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (string, string) {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "PRIVATE KEY", keyDER)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err)
	}
	return n
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
