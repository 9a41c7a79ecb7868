package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles are PEM files a test made: a CA, etcd's server certificate
// (for 127.0.0.1) and a client certificate, each signed by the CA.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

func (f *TLSFiles) clientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// makeTLS writes a CA and two certificates it signs into dir.
func makeTLS(dir string) (*TLSFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tensorcast test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	f := &TLSFiles{CA: filepath.Join(dir, "ca.pem")}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (certPath, keyPath string, err error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		kd, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return "", "", err
		}
		certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		return certPath, keyPath, writePEM(keyPath, "EC PRIVATE KEY", kd)
	}
	if f.ServerCert, f.ServerKey, err = leaf(2, "server", x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if f.ClientCert, f.ClientKey, err = leaf(3, "client", x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	return f, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
