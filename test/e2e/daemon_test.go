package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthAndMetrics: skeind serves /healthz, /readyz and Prometheus
// metrics on loopback, counting requests by verb and code.
func TestHealthAndMetrics(t *testing.T) {
	addr := freeLoopbackPort(t)
	e := newEnv(t, skeintest.Options{Args: []string{"--metrics-addr", addr}})
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://"+addr+p); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Errorf("GET %s = %d %q, want 200 ok", p, code, body)
		}
	}
	l := e.list(t, "metrics", "1.1.0", nil)
	p := e.mustAdd(t, l, harness.NewNS(t, "pod"), "m1")
	if _, err := e.add(t, l, skeintest.RT("m1", p.ns.Path(), "eth0")); err == nil {
		t.Fatal("second ADD of the same key succeeded")
	}
	_, body := httpGet(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`skein_requests_total{code="0",frontdoor="cni",verb="ADD"} 1`,
		`skein_requests_total{code="102",frontdoor="cni",verb="ADD"} 1`,
		`skein_attachments 1`,
		`skein_pool_used_addresses{pool="default"} 2`,
		`skein_request_duration_seconds_count{frontdoor="cni",verb="ADD"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	e.mustDel(t, l, p.rt)
}

// TestMetricsOnlyOnLoopback: a non-loopback metrics address is refused at
// start, with a message saying why.
func TestMetricsOnlyOnLoopback(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	out, err := exec.Command(filepath.Join(bin, "skeind"), "--metrics-addr", "0.0.0.0:9383",
		"--state-dir", t.TempDir(), "--socket", filepath.Join(t.TempDir(), "s.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "loopback") {
		t.Fatalf("skeind with --metrics-addr 0.0.0.0:9383: err=%v, output %q; want a refusal naming loopback", err, out)
	}
}

// TestCleanShutdown: SIGTERM makes skeind exit 0, and attachments outlive
// it: after a restart the pod is still reachable and CHECK passes.
func TestCleanShutdown(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "shutdown", "1.1.0", nil)
	a := e.mustAdd(t, l, harness.NewNS(t, "pod"), "s1")
	b := e.mustAdd(t, l, harness.NewNS(t, "pod"), "s2")
	e.d.Stop(t)
	if err := e.d.ExitErr(); err != nil {
		t.Fatalf("skeind exited with %v on SIGTERM, want status 0; log:\n%s", err, e.d.Log())
	}
	mustReach(t, a.ns, "pod s2 while skeind is down", b.addr(false), b.addr(true))
	e.d.Start(t)
	for _, p := range []*pod{a, b} {
		if err := e.check(t, l, p.rt); err != nil {
			t.Errorf("CHECK %s after restart: %v", p.rt.ContainerID, err)
		}
		e.mustDel(t, l, p.rt)
	}
	e.assertNothingLeft(t)
}

// TestSkeinctl drives the operator CLI against a real skeind.
func TestSkeinctl(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	ctl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(e.d.BinDir, "skeinctl"), append([]string{"--socket", e.d.Socket}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := ctl("pool", "create", "blue", "--subnet", "10.77.0.0/24", "--subnet", "fd00:77::/120", "--block-size-bits", "4", "--reserve", "10.77.0.1-10.77.0.9"); err != nil {
		t.Fatalf("pool create: %v\n%s", err, out)
	}
	if out, err := ctl("pool", "create", "clash", "--subnet", "10.77.0.128/25"); err == nil || !strings.Contains(out, "overlaps") {
		t.Errorf("overlapping pool: err=%v out=%q, want a refusal naming the overlap", err, out)
	}
	l := e.list(t, "ctl", "1.1.0", map[string]any{"pool": "blue"})
	p := e.mustAdd(t, l, harness.NewNS(t, "pod"), "ctl1")
	if got := p.addr(false); got.String() != "10.77.0.10" {
		t.Errorf("first address of pool blue = %v, want 10.77.0.10 (.0 is the network, .1-.9 reserved)", got)
	}

	out, err := ctl("-o", "json", "attachment", "list", "--pool", "blue")
	if err != nil {
		t.Fatalf("attachment list: %v\n%s", err, out)
	}
	var atts []map[string]any
	if err := json.Unmarshal([]byte(out), &atts); err != nil || len(atts) != 1 || atts[0]["containerId"] != "ctl1" {
		t.Errorf("attachment list -o json = %s (%v), want the one attachment ctl1", out, err)
	}
	out, err = ctl("pool", "delete", "blue")
	if err == nil || !strings.Contains(out, "ctl/ctl1/eth0") {
		t.Errorf("deleting a pool in use: err=%v out=%q, want a refusal naming ctl/ctl1/eth0", err, out)
	}
	if out, err := ctl("status"); err != nil || !strings.Contains(out, "blue") || !strings.Contains(out, "Attachments:  1") {
		t.Errorf("status: err=%v\n%s", err, out)
	}
	if out, err := ctl("block", "list", "--pool", "blue"); err != nil || !strings.Contains(out, "10.77.0.0/28") {
		t.Errorf("block list: err=%v\n%s", err, out)
	}
	e.mustDel(t, l, p.rt)
	if out, err := ctl("pool", "delete", "blue"); err != nil {
		t.Errorf("pool delete after DEL: %v\n%s", err, out)
	}
	pools, err := e.d.Admin(t).ListPools(context.Background(), &rpc.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools.Pools {
		if p.Name == "blue" {
			t.Errorf("pool blue still listed after delete: %v", p)
		}
	}
}
