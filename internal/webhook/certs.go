package webhook

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Keys of the certificate Secret.
const (
	keyCA       = "ca.crt"      // the CA that signed tls.crt
	keyCAKey    = "ca.key"      //
	keyNextCA   = "next-ca.crt" // the CA the next rotation signs with
	keyNextKey  = "next-ca.key" //
	keyPrevCA   = "prev-ca.crt" // the CA before ca.crt, trusted until it expires
	keyCert     = "tls.crt"     // the serving certificate
	keyKey      = "tls.key"     //
	keyCABundle = "ca-bundle.crt"
)

// The rotation scheme. A replica must never serve a certificate the API
// server does not trust yet, and the API server learns a new caBundle a
// little after it is patched. So each CA is trusted before it signs
// anything: the Secret always holds the next CA, and the caBundle lists
// the previous, the current and the next CA. A rotation signs a fresh
// serving certificate with the next CA (trusted since the last rotation),
// makes the current CA the previous (certificates it signed stay trusted
// until they expire) and makes a new next CA.
//
// A serving certificate is valid for validity and rotated when a third of
// that is left; a CA is valid for 3*validity, which covers its time as
// next (≤ 2/3), as current (≤ 2/3) and as previous (≤ 1/3).
const caLifetimes = 3

// certSet is the content of the Secret, parsed.
type certSet struct {
	ca, next, prev *x509.Certificate // prev may be nil
	caKey, nextKey *ecdsa.PrivateKey
	leaf           *x509.Certificate
	data           map[string][]byte // the PEM as stored
}

// newCertSet makes a first set: two CAs and a serving certificate for
// names.
func newCertSet(now time.Time, validity time.Duration, names []string) (*certSet, error) {
	data := map[string][]byte{}
	for _, k := range [][2]string{{keyCA, keyCAKey}, {keyNextCA, keyNextKey}} {
		c, key, err := newCA(now, caLifetimes*validity)
		if err != nil {
			return nil, err
		}
		data[k[0]], data[k[1]] = c, key
	}
	s, err := parseCertSet(data, false)
	if err != nil {
		return nil, err
	}
	return s.withLeaf(now, validity, names)
}

// rotate returns the set after one rotation (see caLifetimes).
func (s *certSet) rotate(now time.Time, validity time.Duration, names []string) (*certSet, error) {
	c, key, err := newCA(now, caLifetimes*validity)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{
		keyPrevCA:  s.data[keyCA],
		keyCA:      s.data[keyNextCA],
		keyCAKey:   s.data[keyNextKey],
		keyNextCA:  c,
		keyNextKey: key,
	}
	n, err := parseCertSet(data, false)
	if err != nil {
		return nil, err
	}
	return n.withLeaf(now, validity, names)
}

// withLeaf signs a serving certificate for names with s's CA and fills in
// the bundle.
func (s *certSet) withLeaf(now time.Time, validity time.Duration, names []string) (*certSet, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Minute), // some clock skew
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, &key.PublicKey, s.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	keyPEM, err := keyToPEM(key)
	if err != nil {
		return nil, err
	}
	data := maps(s.data)
	data[keyCert] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	data[keyKey] = keyPEM
	var bundle []byte
	for _, k := range []string{keyPrevCA, keyCA, keyNextCA} {
		if c, err := parseCert(data[k]); err == nil && now.Before(c.NotAfter) {
			bundle = append(bundle, data[k]...)
		}
	}
	data[keyCABundle] = bundle
	return parseCertSet(data, true)
}

// parseCertSet reads a Secret's data; withLeaf says whether the serving
// certificate must be there too.
func parseCertSet(data map[string][]byte, withLeaf bool) (*certSet, error) {
	s := &certSet{data: data}
	var err error
	if s.ca, s.caKey, err = parsePair(data[keyCA], data[keyCAKey]); err != nil {
		return nil, fmt.Errorf("%s: %w", keyCA, err)
	}
	if s.next, s.nextKey, err = parsePair(data[keyNextCA], data[keyNextKey]); err != nil {
		return nil, fmt.Errorf("%s: %w", keyNextCA, err)
	}
	if len(data[keyPrevCA]) > 0 {
		if s.prev, err = parseCert(data[keyPrevCA]); err != nil {
			return nil, fmt.Errorf("%s: %w", keyPrevCA, err)
		}
	}
	if !withLeaf {
		return s, nil
	}
	pair, err := tls.X509KeyPair(data[keyCert], data[keyKey])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyCert, err)
	}
	s.leaf = pair.Leaf
	if err := s.leaf.CheckSignatureFrom(s.ca); err != nil {
		return nil, fmt.Errorf("%s is not signed by %s: %w", keyCert, keyCA, err)
	}
	if !bytes.Contains(data[keyCABundle], data[keyCA]) || !bytes.Contains(data[keyCABundle], data[keyNextCA]) {
		return nil, fmt.Errorf("%s lacks the current or the next CA", keyCABundle)
	}
	return s, nil
}

// due reports why the set must be rotated at now, or "" when it need not:
// a third of the serving certificate's validity is left, a CA is near its
// end, or the certificate lacks one of names.
func (s *certSet) due(now time.Time, validity time.Duration, names []string) string {
	renewAt := s.leaf.NotAfter.Add(-validity / 3)
	switch {
	case !now.Before(renewAt):
		return fmt.Sprintf("serving certificate expires at %s", s.leaf.NotAfter.UTC().Format(time.RFC3339))
	case s.leaf.NotAfter.Sub(s.leaf.NotBefore) > validity+2*time.Minute:
		return "validity was shortened"
	case !now.Before(s.ca.NotAfter.Add(-validity)) || !now.Before(s.next.NotAfter.Add(-2*validity)):
		return "a CA nears its end"
	}
	for _, n := range names {
		if err := s.leaf.VerifyHostname(n); err != nil {
			return fmt.Sprintf("serving certificate does not cover %s", n)
		}
	}
	return ""
}

// tlsCertificate is the serving certificate for a TLS server.
func (s *certSet) tlsCertificate() (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(s.data[keyCert], s.data[keyKey])
	if err != nil {
		return nil, fmt.Errorf("load serving certificate: %w", err)
	}
	return &c, nil
}

func newCA(now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	sn := serial()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "skein-webhook-ca-" + sn.Text(16)[:8]},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("make CA: %w", err)
	}
	keyPEM, err = keyToPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.SetBit(n, 126, 1) // a fixed length, so the CA names line up
}

func keyToPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	c, err := parseCert(certPEM)
	if err != nil {
		return nil, nil, err
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, nil, errors.New("no PEM key")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || !ek.PublicKey.Equal(c.PublicKey) {
		return nil, nil, errors.New("key does not match certificate")
	}
	return c, ek, nil
}

func maps(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}
