package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMaxConnectionsGit(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxConnections = 1 })
	s.seed(t, "team/app")
	hold, err := net.Dial("tcp", s.GitAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the server count it
	out, err := s.env.Run("", nil, "ls-remote", s.gitURL("team/app"))
	if err == nil || !strings.Contains(out, "remote error: server busy: too many connections (max 1)") {
		t.Fatalf("over the limit: err=%v\n%s", err, out)
	}
	if !strings.Contains(s.logs.String(), "too many connections") {
		t.Fatal("refusal not logged")
	}
	hold.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		if _, err := s.env.Run("", nil, "ls-remote", s.gitURL("team/app")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("connection slot not released")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOversizedPktLine(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	got := rawGit(t, s.GitAddr.String(), []byte("ffff"+strings.Repeat("a", 100)))
	if !strings.Contains(got, "ERR malformed request: pkt-line: length exceeds 65520") {
		t.Fatalf("got %q", got)
	}
}

// TestTLS serves HTTPS with a self-signed certificate and clones through it.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, certFile, keyFile)
	s := startServer(t, func(c *Config) { c.TLSCert, c.TLSKey = certFile, keyFile })
	s.seed(t, "team/app")
	url := fmt.Sprintf("https://%s/team/app", s.HTTPAddr)
	clone := filepath.Join(t.TempDir(), "c")
	out, err := s.env.Run("", []string{"GIT_SSL_CAINFO=" + certFile}, "clone", url, clone)
	if err != nil {
		t.Fatalf("clone over TLS: %v\n%s", err, out)
	}
	if out, err := s.env.Run("", nil, "ls-remote", url); err == nil {
		t.Fatalf("an unverified certificate was accepted: %s", out)
	}
}

func writeSelfSigned(t *testing.T, certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}
