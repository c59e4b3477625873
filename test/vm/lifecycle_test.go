package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/vm/handover"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

func skeintestCode(err error) uint { return skeintest.ErrCode(err) }

// udhcpcOnce takes one lease in vm and returns the address udhcpc got.
func udhcpcOnce(t *testing.T, vm *harness.NS, ifName string) (string, error) {
	t.Helper()
	dir, script := clientScript(t, udhcpcScript)
	out, err := run(t, vm, 20*time.Second, "udhcpc", "-f", "-q", "-n", "-i", ifName, "-s", script, "-t", "8", "-T", "1")
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return readEnv(t, filepath.Join(dir, "bound.env"))["ip"], nil
}

// TestRestart: skeind killed (SIGKILL) and started again finds the VM
// attachment from its record and tagged bridge and serves DHCP again;
// CHECK passes; DEL still gives the pod back.
func TestRestart(t *testing.T) {
	skeintest.RequireTool(t, "udhcpc")
	e := newEnv(t)
	l := e.skeinChain(t, "vm-restart", "1.0.0", nil)
	p := e.mustAddVM(t, l, "restarted")
	vm, ifName := p.vmSide(t)
	if got, err := udhcpcOnce(t, vm, ifName); err != nil || got != p.addr4.Addr().String() {
		t.Fatalf("lease before the restart: %q %v", got, err)
	}
	e.d.Kill(t)
	e.d.Start(t)
	if !strings.Contains(e.d.Log(), "served=1") {
		t.Errorf("the restarted skeind should report one VM attachment served again; log:\n%s", e.d.Log())
	}
	if got, err := udhcpcOnce(t, vm, ifName); err != nil || got != p.addr4.Addr().String() {
		t.Errorf("lease after the restart: got %q (%v), want %s", got, err, p.addr4.Addr())
	}
	if _, err := e.execVM(t, "CHECK", e.vmConf("vm-restart", "1.0.0", p.res), "restarted", p.ns.Path(), "eth0"); err != nil {
		t.Errorf("CHECK after the restart: %v", err)
	}
	if err := e.del(l, p.rt); err != nil {
		t.Fatalf("DEL after the restart: %v", err)
	}
	for _, n := range linkNames(t, p.ns) {
		if strings.HasPrefix(n, "skbr") || strings.HasPrefix(n, "sktap") || n == "eth0" {
			t.Errorf("after DEL of the whole chain the pod still has %s", n)
		}
	}
}

// TestCheck: CHECK passes on what ADD made and fails (code 110) once the
// tap is gone.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-check", "1.1.0", nil)
	p := e.mustAddVM(t, l, "checked")
	conf := e.vmConf("vm-check", "1.1.0", p.res)
	if _, err := e.execVM(t, "CHECK", conf, "checked", p.ns.Path(), "eth0"); err != nil {
		t.Fatalf("CHECK right after ADD: %v", err)
	}
	h := p.ns.Handle(t)
	tap, err := h.LinkByName(p.tap)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(tap); err != nil {
		t.Fatal(err)
	}
	_, err = e.execVM(t, "CHECK", conf, "checked", p.ns.Path(), "eth0")
	wantCode(t, "CHECK without the tap", err, 110)
	if err != nil && !strings.Contains(err.Error(), p.tap) {
		t.Errorf("the CHECK error should name the missing tap %s: %v", p.tap, err)
	}
	_, err = e.execVM(t, "CHECK", conf, "other", p.ns.Path(), "eth0")
	wantCode(t, "CHECK of an unknown container", err, types.ErrUnknownContainer)
}

// TestBadInput: every malformed ADD gets a clear spec error and leaves the
// pod exactly as the main plugin made it.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	ns, prev := e.podOnly(t, "vm-bad", "badpod")
	before := harness.Snapshot(t, ns)
	raw, _ := json.Marshal(prev)
	var prevMap map[string]any
	_ = json.Unmarshal(raw, &prevMap)
	mutate := func(f func(m map[string]any)) map[string]any {
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		f(m)
		return m
	}
	file := filepath.Join(t.TempDir(), "notans")
	_ = os.WriteFile(file, nil, 0o644)
	for _, c := range []struct {
		name   string
		prev   any
		netns  string
		code   uint
		inText string
	}{
		{"no prevResult", nil, ns.Path(), types.ErrInvalidNetworkConfig, "chained plugin"},
		{"prevResult without addresses", mutate(func(m map[string]any) { delete(m, "ips") }), ns.Path(), types.ErrInvalidNetworkConfig, "no interface inside the sandbox"},
		{"interface the main plugin did not make", mutate(func(m map[string]any) {
			m["interfaces"].([]any)[1].(map[string]any)["name"] = "eth9"
		}), ns.Path(), types.ErrInvalidNetworkConfig, "eth9"},
		{"MAC the interface does not have", mutate(func(m map[string]any) {
			m["interfaces"].([]any)[1].(map[string]any)["mac"] = "02:de:ad:be:ef:00"
		}), ns.Path(), types.ErrInvalidNetworkConfig, "promised"},
		{"netns vanished", prevMap, "/run/netns/skein-vm-no-such-ns", types.ErrUnknownContainer, "does not exist"},
		{"netns not a namespace", prevMap, file, types.ErrInvalidEnvironmentVariables, "not a network namespace"},
	} {
		_, err := e.execVM(t, "ADD", e.vmConf("vm-bad", "1.0.0", c.prev), "badpod", c.netns, "eth0")
		wantCode(t, c.name, err, c.code)
		if err != nil && !strings.Contains(err.Error(), c.inText) {
			t.Errorf("%s: the error should say %q: %v", c.name, c.inText, err)
		}
		harness.AssertSame(t, before, harness.Snapshot(t, ns))
	}
	if _, err := os.Stat(handover.TokenPath(e.tokenDir(), "badpod")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed ADD must not leave a token file: %v", err)
	}

	// A second ADD of the same attachment is refused and the first stays.
	conf := e.vmConf("vm-bad", "1.0.0", prevMap)
	if _, err := e.execVM(t, "ADD", conf, "badpod", ns.Path(), "eth0"); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	_, err := e.execVM(t, "ADD", conf, "badpod", ns.Path(), "eth0")
	wantCode(t, "second ADD", err, 102)
	if _, err := e.execVM(t, "CHECK", conf, "badpod", ns.Path(), "eth0"); err != nil {
		t.Errorf("the first ADD's plumbing should survive the refused second one: %v", err)
	}
	// The same interface under another network name: already a bridge port.
	_, err = e.execVM(t, "ADD", e.vmConf("vm-bad2", "1.0.0", prevMap), "badpod", ns.Path(), "eth0")
	wantCode(t, "ADD of an interface already handed to a VM", err, 102)
	if _, err := e.execVM(t, "DEL", conf, "badpod", ns.Path(), "eth0"); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, ns))
}

// TestTapHandover: the tap descriptor goes to whoever shows the
// container's token, to one holder at a time, and the token file goes
// away with the container's last VM attachment.
func TestTapHandover(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-fd", "1.1.0", nil)
	p := e.mustAddVM(t, l, "fdpod")
	tokPath := handover.TokenPath(e.tokenDir(), "fdpod")
	for path, want := range map[string]os.FileMode{e.tokenDir(): 0o700 | os.ModeDir, tokPath: 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, st.Mode(), err, want)
		}
	}
	token, err := handover.ReadToken(e.tokenDir(), "fdpod")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(p.res), token) {
		t.Error("the token must not appear in the CNI result")
	}
	if _, _, err := handover.Fetch(e.vmSocket(), "fdpod", strings.Repeat("0", len(token)), 5*time.Second); err == nil {
		t.Error("a wrong token must be refused")
	}
	if _, _, err := handover.Fetch(e.vmSocket(), "nosuch", token, 5*time.Second); err == nil {
		t.Error("another container's token must be refused")
	}
	ifs, files, err := handover.Fetch(e.vmSocket(), "fdpod", token, 5*time.Second)
	if err != nil {
		t.Fatalf("fetch with the right token: %v", err)
	}
	if len(ifs) != 1 || len(files) != 1 || ifs[0].MAC != p.vmMAC || ifs[0].Tap != p.tap || ifs[0].MTU != podMTU {
		t.Fatalf("handover: %+v (%d files), want tap %s with MAC %s", ifs, len(files), p.tap, p.vmMAC)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(int(files[0].Fd()), unix.TUNGETIFF, ifr); err != nil || ifr.Name() != p.tap {
		t.Errorf("the descriptor should be attached to tap %s: %q %v", p.tap, ifr.Name(), err)
	}
	if _, _, err := handover.Fetch(e.vmSocket(), "fdpod", token, 5*time.Second); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a second launcher while the first holds the tap should be refused as busy, got %v", err)
	}
	files[0].Close()
	_, files, err = handover.Fetch(e.vmSocket(), "fdpod", token, 5*time.Second)
	if err != nil {
		t.Errorf("after the first holder closed the tap a new launcher should get it: %v", err)
	} else {
		files[0].Close()
	}
	if err := e.del(l, p.rt); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tokPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the token file should go with the container's last VM attachment: %v", err)
	}
}

// TestGC: CNI GC through the whole chain with no valid attachment
// removes the VM networking and skein's attachment.
func TestGC(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-gc", "1.1.0", nil)
	p := e.mustAddVM(t, l, "collected")
	c, cancel := callCtx()
	defer cancel()
	if err := e.cni.GCNetworkList(c, l, &libcni.GCArgs{}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	for _, n := range linkNames(t, p.ns) {
		if strings.HasPrefix(n, "skbr") || strings.HasPrefix(n, "sktap") {
			t.Errorf("after GC the pod still has %s", n)
		}
	}
	if _, err := e.execVM(t, "CHECK", e.vmConf("vm-gc", "1.1.0", p.res), "collected", p.ns.Path(), "eth0"); skeintestCode(err) != types.ErrUnknownContainer {
		t.Errorf("after GC skein-vm should not know the attachment: %v", err)
	}
	if atts := e.d.Attachments(t); len(atts) != 0 {
		t.Errorf("after GC skeind holds %d attachments", len(atts))
	}
}
