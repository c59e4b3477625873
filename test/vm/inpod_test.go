package vm

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/vm/handover"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// vmLinks lists the bridge and tap skein-vm makes in a pod.
func vmLinks(t *testing.T, ns *harness.NS) []string {
	var out []string
	for _, n := range linkNames(t, ns) {
		if strings.HasPrefix(n, "skbr") || strings.HasPrefix(n, "sktap") {
			out = append(out, n)
		}
	}
	return out
}

// TestPodAnnotationOptIn: with podAnnotation, skein-vm chained in a
// node's only conflist turns into a VM only the pods whose annotation
// (passed by the runtime through the pod-annotations capability) is
// "true"; other pods get the main plugin's result untouched and keep
// their interface; a value other than true/false is refused and skein-vm
// makes nothing.
func TestPodAnnotationOptIn(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-optin", "1.1.0", skeintest.Plugin{
		"podAnnotation": "skein.dev/vm",
		"capabilities":  map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	})
	rt := func(id string, ns *harness.NS, ann map[string]string) *libcni.RuntimeConf {
		r := skeintest.RT(id, ns.Path(), "eth0")
		if ann != nil {
			r.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": ann}
		}
		return r
	}

	// A plain pod: no annotation, then one saying false.
	for i, ann := range []map[string]string{nil, {"skein.dev/vm": "false", "other": "x"}} {
		ns := harness.NewNS(t, "plain")
		r := rt("plain"+string(rune('a'+i)), ns, ann)
		res, err := e.add(l, r)
		if err != nil {
			t.Fatalf("ADD of a pod with annotations %v: %v", ann, err)
		}
		for _, itf := range res.Interfaces {
			if strings.HasPrefix(itf.Name, "sktap") || strings.HasPrefix(itf.Name, "skbr") {
				t.Errorf("annotations %v: the result names %s; a plain pod's result is the main plugin's", ann, itf.Name)
			}
		}
		if links := vmLinks(t, ns); len(links) != 0 {
			t.Errorf("annotations %v: the pod has %v", ann, links)
		}
		addrs, err := ns.Handle(t).AddrList(mustLink(t, ns, "eth0"), unix.AF_INET)
		if err != nil || len(addrs) != 1 {
			t.Errorf("annotations %v: a plain pod keeps its address on eth0: %v %v", ann, addrs, err)
		}
		c, cancel := callCtx()
		if err := e.cni.CheckNetworkList(c, l, r); err != nil {
			t.Errorf("CHECK of a plain pod: %v", err)
		}
		cancel()
		if err := e.del(l, r); err != nil {
			t.Errorf("DEL of a plain pod: %v", err)
		}
	}

	// A VM pod.
	ns := harness.NewNS(t, "vmpod")
	r := rt("vmpod", ns, map[string]string{"skein.dev/vm": "true"})
	res, err := e.add(l, r)
	if err != nil {
		t.Fatalf("ADD of a VM pod: %v", err)
	}
	if !slices.ContainsFunc(res.Interfaces, func(i *types100.Interface) bool { return strings.HasPrefix(i.Name, "sktap") }) {
		t.Errorf("a pod annotated skein.dev/vm=true should get a tap; interfaces: %s", ifaces(res))
	}
	if len(vmLinks(t, ns)) != 2 {
		t.Errorf("the VM pod has %v, want its bridge and tap", vmLinks(t, ns))
	}
	if err := e.del(l, r); err != nil {
		t.Fatal(err)
	}
	if links := vmLinks(t, ns); len(links) != 0 {
		t.Errorf("after DEL the VM pod still has %v", links)
	}

	// A typo is not silently a plain pod, and skein-vm makes nothing.
	ns = harness.NewNS(t, "typo")
	r = rt("typo", ns, map[string]string{"skein.dev/vm": "yes"})
	_, err = e.add(l, r)
	if skeintestCode(err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "skein.dev/vm") {
		t.Errorf("annotation skein.dev/vm=yes: want code 7 naming the annotation, got %v", err)
	}
	if links := vmLinks(t, ns); len(links) != 0 {
		t.Errorf("a refused VM ADD left %v", links)
	}
	if err := e.del(l, r); err != nil { // as the runtime does after a failed ADD
		t.Errorf("DEL after the refused ADD: %v", err)
	}
	if atts := e.d.Attachments(t); len(atts) != 0 {
		t.Errorf("skeind still holds %d attachments", len(atts))
	}

	// A podAnnotation that is no annotation name is a bad configuration.
	bad := e.vmConf("vm-optin", "1.1.0", res)
	bad["podAnnotation"] = "not a name!"
	if _, err := e.execVM(t, "ADD", bad, "badconf", ns.Path(), "eth0"); skeintestCode(err) != types.ErrInvalidNetworkConfig {
		t.Errorf("podAnnotation %q: want code 7, got %v", "not a name!", err)
	}
}

// TestTapHandoverByNetNS: a launcher inside the VM's pod (qemu as the
// pod's container) proves itself with its network namespace and gets the
// pod's taps without a container ID or token; a launcher in another
// namespace, a descriptor that is not a namespace and a request without
// one are refused; skein-vmwrapper does it with SKEIN_VM_IN_POD=1.
func TestTapHandoverByNetNS(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-own", "1.1.0", nil)
	p := e.mustAddVM(t, l, "ownpod")

	var ifs []handover.Interface
	var files []*os.File
	if err := p.ns.Do(func() (err error) {
		ifs, files, err = handover.FetchOwn(e.vmSocket(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("fetch from inside the pod: %v", err)
	}
	if len(ifs) != 1 || len(files) != 1 || ifs[0].Tap != p.tap || ifs[0].MAC != p.vmMAC {
		t.Fatalf("handover by namespace: %+v (%d files), want tap %s with MAC %s", ifs, len(files), p.tap, p.vmMAC)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(int(files[0].Fd()), unix.TUNGETIFF, ifr); err != nil || ifr.Name() != p.tap {
		t.Errorf("the descriptor should be attached to tap %s: %q %v", p.tap, ifr.Name(), err)
	}
	files[0].Close()

	other := harness.NewNS(t, "other")
	if err := other.Do(func() error {
		_, fs, err := handover.FetchOwn(e.vmSocket(), 5*time.Second)
		for _, f := range fs {
			f.Close()
		}
		return err
	}); err == nil || !strings.Contains(err.Error(), "no VM attachment") {
		t.Errorf("a launcher in another pod's namespace must be refused, got %v", err)
	}

	// Raw requests a hostile launcher could send.
	regular, err := os.Open("/etc/hostname")
	if err != nil {
		regular, err = os.Open(os.Args[0])
	}
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	mntNS, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	defer mntNS.Close()
	for _, c := range []struct {
		what string
		req  handover.Request
		fds  []int
		want string
	}{
		{"a regular file as the namespace", handover.Request{NetNS: true}, []int{int(regular.Fd())}, "not a namespace"},
		{"a mount namespace", handover.Request{NetNS: true}, []int{int(mntNS.Fd())}, "not a network namespace"},
		{"no descriptor", handover.Request{NetNS: true}, nil, "one descriptor"},
		{"a descriptor with a container request", handover.Request{ContainerID: "ownpod", Token: "x"}, []int{int(regular.Fd())}, "carries no descriptor"},
	} {
		if got := rawRequest(t, e.vmSocket(), c.req, c.fds); !strings.Contains(got.Error, c.want) || len(got.Interfaces) != 0 {
			t.Errorf("%s: got %+v, want an error containing %q", c.what, got, c.want)
		}
	}

	// skein-vmwrapper in the pod, with a stand-in emulator that prints
	// what it was given and whether the descriptor is open.
	emu := filepath.Join(t.TempDir(), "emu")
	if err := os.WriteFile(emu, []byte("#!/bin/sh\nfor a; do echo \"arg $a\"; done\nls /proc/self/fd | sed 's/^/fd /'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := p.ns.Do(func() error {
		cmd := exec.Command(filepath.Join(e.d.BinDir, "skein-vmwrapper"), "-m", "64")
		cmd.Env = []string{"SKEIN_VM_IN_POD=1", "SKEIN_VM_EMULATOR=" + emu, "SKEIN_VM_SOCKET=" + e.vmSocket(), "PATH=/usr/bin:/bin"}
		var err error
		out, err = cmd.CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("skein-vmwrapper with SKEIN_VM_IN_POD=1: %v\n%s", err, out)
	}
	var fd string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "arg tap,id=skein0,fd="); ok {
			fd = rest
		}
	}
	if fd == "" || !strings.Contains(string(out), "mac="+p.vmMAC) || !strings.Contains(string(out), "\nfd "+fd+"\n") {
		t.Errorf("the emulator should get -netdev tap,fd=N (N open) and the VM's MAC %s; it saw:\n%s", p.vmMAC, out)
	}
	cmd := exec.Command(filepath.Join(e.d.BinDir, "skein-vmwrapper"))
	cmd.Env = []string{"SKEIN_VM_IN_POD=1", "SKEIN_VM_CONTAINER_ID=ownpod", "SKEIN_VM_EMULATOR=" + emu}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "choose one") {
		t.Errorf("both SKEIN_VM_IN_POD and SKEIN_VM_CONTAINER_ID: want a refusal, got %v\n%s", err, out)
	}
}

// rawRequest sends one handover request with fds attached and reads the
// answer (closing any descriptor that came back).
func rawRequest(t *testing.T, socket string, req handover.Request, fds []int) handover.Response {
	t.Helper()
	conn, err := net.DialTimeout("unixpacket", socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := json.Marshal(req)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := uc.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, handover.MaxMessage)
	roob := make([]byte, unix.CmsgSpace(4*handover.MaxInterfaces))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, roob)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := handover.ParseRights(roob[:oobn])
	for _, f := range files {
		f.Close()
	}
	var resp handover.Response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func mustLink(t *testing.T, ns *harness.NS, name string) netlink.Link {
	t.Helper()
	l, err := ns.Handle(t).LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
