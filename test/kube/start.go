package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Timeouts for a loaded two-core machine (seen: etcd ready in well under a
// second, the API server in about four).
const (
	etcdTimeout      = 30 * time.Second
	apiserverTimeout = 90 * time.Second
	// attempts is how often a process is restarted on new ports when a
	// port chosen by freePort was taken before it bound it.
	attempts = 3
)

// start runs etcd, then kube-apiserver, and sets Config, URL and CAFile.
func (e *Env) start(assets string, opts Options) error {
	for _, d := range []string{"etcd", "certs"} {
		if err := os.MkdirAll(filepath.Join(e.Dir, d), 0o700); err != nil {
			return err
		}
	}
	ips := opts.ServingIPs
	if a := net.ParseIP(opts.Address); a != nil {
		ips = append(ips, a)
	}
	c, err := writeCredentials(filepath.Join(e.Dir, "certs"), opts.Users, ips)
	if err != nil {
		return err
	}
	e.tokens, e.CAFile = c.tokens, c.caFile
	if err := e.startEtcd(filepath.Join(assets, "etcd")); err != nil {
		return err
	}
	addr := opts.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	if err := e.startAPIServer(filepath.Join(assets, "kube-apiserver"), c, addr, opts.APIServerArgs); err != nil {
		return err
	}
	return nil
}

func (e *Env) startEtcd(bin string) error {
	for try := 1; ; try++ {
		client, err1 := freePort()
		peer, err2 := freePort()
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		e.EtcdURL = "http://127.0.0.1:" + client
		peerURL := "http://127.0.0.1:" + peer
		args := []string{
			"--name=skein-test",
			"--data-dir=" + filepath.Join(e.Dir, "etcd"),
			"--listen-client-urls=" + e.EtcdURL,
			"--advertise-client-urls=" + e.EtcdURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=skein-test=" + peerURL,
			// A test's data is thrown away: fsync buys nothing.
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
		p, err := e.startProc("etcd", bin, args, filepath.Join(e.Dir, "etcd.log"))
		if err != nil {
			return err
		}
		e.etcd = p
		err = waitReady(p, etcdTimeout, &http.Client{Transport: &http.Transport{DialContext: e.DialContext}}, e.EtcdURL+"/health", "")
		if err != nil && p.portConflict() && try < attempts {
			os.RemoveAll(filepath.Join(e.Dir, "etcd"))
			continue
		}
		return err
	}
}

func (e *Env) startAPIServer(bin string, c *credentials, addr string, extra []string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: e.DialContext}, Timeout: 5 * time.Second}
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		e.URL = "https://" + net.JoinHostPort(addr, port)
		flags := map[string]string{
			"etcd-servers":                     e.EtcdURL,
			"bind-address":                     addr,
			"advertise-address":                addr,
			"secure-port":                      port,
			"cert-dir":                         filepath.Join(e.Dir, "certs"),
			"tls-cert-file":                    c.servingCert,
			"tls-private-key-file":             c.servingKey,
			"client-ca-file":                   c.caFile,
			"token-auth-file":                  c.tokenFile,
			"authorization-mode":               "RBAC",
			"service-account-issuer":           e.URL,
			"service-account-key-file":         c.saPublic,
			"service-account-signing-key-file": c.saPrivate,
			"service-cluster-ip-range":         "10.0.0.0/24",
			// No kube-controller-manager mints service account tokens.
			"disable-admission-plugins": "ServiceAccount",
			// No Service endpoints for the API server itself.
			"endpoint-reconciler-type": "none",
			"profiling":                "false",
		}
		for _, a := range extra {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			delete(flags, name)
		}
		var args []string
		for _, k := range slices.Sorted(maps.Keys(flags)) {
			args = append(args, "--"+k+"="+flags[k])
		}
		args = append(args, extra...)
		p, err := e.startProc("kube-apiserver", bin, args, filepath.Join(e.Dir, "kube-apiserver.log"))
		if err != nil {
			return err
		}
		e.apiserver = p
		err = waitReady(p, apiserverTimeout, hc, e.URL+"/readyz", c.tokens[AdminUser])
		if err != nil && p.portConflict() && try < attempts {
			continue
		}
		if err != nil {
			return err
		}
		e.Config = &rest.Config{
			Host:            e.URL,
			BearerToken:     c.tokens[AdminUser],
			TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
			// The defaults (5 and 10) would throttle the tests' bursts.
			QPS:   200,
			Burst: 400,
		}
		if e.netns != "" {
			e.Config.Dial = e.DialContext
		}
		return nil
	}
}

// waitReady polls url until it answers 200, p exits or timeout passes.
func waitReady(p *proc, timeout time.Duration, hc *http.Client, url, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready", p.name, p.err)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (last answer: %s)", p.name, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
