package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// credentials are the files the API server is started with.
type credentials struct {
	caPEM                   []byte
	caFile                  string
	servingCert, servingKey string // for 127.0.0.1 and localhost, signed by the CA
	saPublic, saPrivate     string // the service account token signing key
	tokenFile               string
	tokens                  map[string]string // user → bearer token
}

// writeCredentials makes a CA, the API server's serving certificate, a
// service account signing key and a token file (AdminUser in
// system:masters, then users) in dir. Keys are ECDSA P-256: quick to make.
func writeCredentials(dir string, users []User, ips []net.IP) (*credentials, error) {
	c := &credentials{
		caFile:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saPublic:    filepath.Join(dir, "sa.pub"),
		saPrivate:   filepath.Join(dir, "sa.key"),
		tokenFile:   filepath.Join(dir, "tokens.csv"),
		tokens:      map[string]string{},
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "skein-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("make CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	c.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  append([]net.IP{net.IPv4(127, 0, 0, 1)}, ips...),
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("make serving certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make service account key: %w", err)
	}

	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}

	var tokens strings.Builder
	all := append([]User{{Name: AdminUser, Groups: []string{"system:masters"}}}, users...)
	for i, u := range all {
		if _, dup := c.tokens[u.Name]; dup || u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("bad or repeated user name %q", u.Name)
		}
		tok := make([]byte, 16)
		if _, err := rand.Read(tok); err != nil {
			return nil, err
		}
		c.tokens[u.Name] = hex.EncodeToString(tok)
		// token,user,uid[,"group1,group2"]
		fmt.Fprintf(&tokens, "%s,%s,%d", c.tokens[u.Name], u.Name, 1000+i)
		if len(u.Groups) > 0 {
			fmt.Fprintf(&tokens, ",%q", strings.Join(u.Groups, ","))
		}
		tokens.WriteString("\n")
	}

	files := []struct {
		path string
		data []byte
	}{
		{c.caFile, c.caPEM},
		{c.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		{c.servingKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})},
		{c.saPrivate, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER})},
		{c.saPublic, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})},
		{c.tokenFile, []byte(tokens.String())},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return c, nil
}
