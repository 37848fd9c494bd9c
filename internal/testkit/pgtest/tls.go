package pgtest

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
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
	ca, caKey := netkit.NewCA(t, "pgtest CA")
	f.CA = netkit.WritePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	other, _ := netkit.NewCA(t, "pgtest other CA")
	f.OtherCA = netkit.WritePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	f.ServerCert, f.ServerKey = netkit.Leaf(t, dir, "server", ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	f.ClientCert, f.ClientKey = netkit.Leaf(t, dir, "client", ca, caKey, &x509.Certificate{
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
