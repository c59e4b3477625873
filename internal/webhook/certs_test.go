package webhook

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

var testNames = []string{"skein-webhook.skein-system.svc", "localhost", "127.0.0.1"}

// verifies reports whether the bundle trusts leaf for name at now.
func verifies(t *testing.T, bundle []byte, leaf *x509.Certificate, name string, now time.Time) bool {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificate")
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: now})
	return err == nil
}

func TestCertSetRotation(t *testing.T) {
	const v = 90 * 24 * time.Hour
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := newCertSet(t0, v, testNames)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range testNames {
		if !verifies(t, s.data[keyCABundle], s.leaf, n, t0) {
			t.Errorf("first certificate not trusted for %s", n)
		}
	}
	if why := s.due(t0, v, testNames); why != "" {
		t.Errorf("a fresh set is due: %s", why)
	}
	if why := s.due(t0.Add(v/2), v, testNames); why != "" {
		t.Errorf("due at half life: %s", why)
	}
	if why := s.due(t0, v, append(testNames, "other.svc")); !strings.Contains(why, "does not cover other.svc") {
		t.Errorf("a new name: due says %q", why)
	}
	if why := s.due(t0, v/2, testNames); why == "" {
		t.Error("a shorter validity does not make the set due")
	}

	// Rotate many times, each when due; the key property: the bundle
	// patched before a rotation already trusts the certificate served
	// after it, and the bundle after it still trusts the one served
	// before (replicas switch at different moments).
	now := t0
	for i := 0; i < 6; i++ {
		now = now.Add(v / 6)
		for s.due(now, v, testNames) == "" {
			now = now.Add(v / 6)
		}
		if now.Sub(t0) > v*time.Duration(i+1) {
			t.Fatalf("rotation %d came after the certificate expired", i)
		}
		n, err := s.rotate(now, v, testNames)
		if err != nil {
			t.Fatal(err)
		}
		if !verifies(t, s.data[keyCABundle], n.leaf, testNames[0], now) {
			t.Fatalf("rotation %d: old bundle does not trust the new certificate", i)
		}
		if !verifies(t, n.data[keyCABundle], s.leaf, testNames[0], now) {
			t.Fatalf("rotation %d: new bundle does not trust the old certificate", i)
		}
		if !verifies(t, n.data[keyCABundle], n.leaf, testNames[0], now) {
			t.Fatalf("rotation %d: new bundle does not trust the new certificate", i)
		}
		if n.leaf.SerialNumber.Cmp(s.leaf.SerialNumber) == 0 || n.ca.Equal(s.ca) {
			t.Fatalf("rotation %d changed nothing", i)
		}
		if !n.ca.Equal(s.next) || !n.prev.Equal(s.ca) {
			t.Fatalf("rotation %d did not promote the next CA", i)
		}
		if strings.Count(string(n.data[keyCABundle]), "BEGIN CERTIFICATE") != 3 {
			t.Fatalf("rotation %d: bundle holds %d CAs, want 3", i, strings.Count(string(n.data[keyCABundle]), "BEGIN"))
		}
		if _, err := parseCertSet(n.data, true); err != nil {
			t.Fatalf("rotation %d: stored data does not parse: %v", i, err)
		}
		s = n
	}
}

func TestParseCertSetRefusesDamage(t *testing.T) {
	s, err := newCertSet(time.Now(), time.Hour, testNames)
	if err != nil {
		t.Fatal(err)
	}
	other, err := newCertSet(time.Now(), time.Hour, testNames)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(map[string][]byte)
		want string
	}{
		{"no CA", func(d map[string][]byte) { delete(d, keyCA) }, "ca.crt"},
		{"wrong CA key", func(d map[string][]byte) { d[keyCAKey] = other.data[keyCAKey] }, "does not match"},
		{"leaf from another CA", func(d map[string][]byte) { d[keyCert], d[keyKey] = other.data[keyCert], other.data[keyKey] }, "not signed by"},
		{"garbage leaf", func(d map[string][]byte) { d[keyCert] = []byte("x") }, "tls.crt"},
		{"bundle lacks next", func(d map[string][]byte) { d[keyCABundle] = d[keyCA] }, "lacks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := maps(s.data)
			tc.edit(d)
			_, err := parseCertSet(d, true)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
