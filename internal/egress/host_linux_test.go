package egress

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// podNS is a namespace with an address and a default route, as a pod has
// after its ADD (enough for ApplyClient to pick a tunnel's local address).
func podNS(t *testing.T) *harness.NS {
	t.Helper()
	pod := harness.NewNS(t, "egpod")
	peer := harness.NewNS(t, "egnode")
	pod.AddVeth(t, harness.Veth{Name: "eth0", PeerName: "vpod", Peer: peer})
	pod.AddAddr(t, "eth0", netip.MustParsePrefix("10.100.0.10/24"))
	if out, err := pod.Exec(t, "ip", "route", "add", "default", "via", "10.100.0.1"); err != nil {
		t.Fatalf("default route: %v\n%s", err, out)
	}
	return pod
}

var oneGateway = ClientConfig{Gateways: []Gateway{{
	Namespace: "default", Name: "egress",
	ServiceIPs:   []netip.Addr{netip.MustParseAddr("10.96.0.50")},
	Destinations: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
}}}

// TestApplyClientWithoutFoU is the real failure path of a kernel without
// fou (this host's): a clear error naming the module, and the namespace
// exactly as before.
func TestApplyClientWithoutFoU(t *testing.T) {
	harness.RequireRoot(t)
	if requireFoU() == nil {
		t.Skip("skipping: this kernel has fou; the failure path needs one without (the guest tests cover the kernel that has it)")
	}
	pod := podNS(t)
	before := harness.Snapshot(t, pod)
	err := ApplyClient(pod.Path(), oneGateway)
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou module not available") {
		t.Fatalf("ApplyClient on a kernel without fou: err = %v, want ErrNotSupported naming fou", err)
	}
	t.Logf("the error: %v", err)
	harness.AssertSame(t, before, harness.Snapshot(t, pod))
	st, err := ClientState(pod.Path())
	if err != nil || !st.Empty() {
		t.Errorf("ClientState after the failure = %+v, %v; want empty", st, err)
	}
	// The zero config needs no module: removing nothing succeeds.
	if err := ApplyClient(pod.Path(), ClientConfig{}); err != nil {
		t.Errorf("zero config without fou: %v", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))

	_, err = NewRouter(RouterConfig{NetNS: pod.Path(), Local4: netip.MustParseAddr("10.100.0.10")})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou module not available") {
		t.Fatalf("NewRouter on a kernel without fou: err = %v, want ErrNotSupported naming fou", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))
}

// TestApplyClientBadInput: invalid configurations change nothing, on any
// kernel (validation comes before the first change).
func TestApplyClientBadInput(t *testing.T) {
	pod := podNS(t)
	before := harness.Snapshot(t, pod)
	mix := ClientConfig{Gateways: []Gateway{{Namespace: "a", Name: "b",
		ServiceIPs:   []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2")},
		Destinations: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}}
	if err := ApplyClient(pod.Path(), mix); !errors.Is(err, ErrInvalid) {
		t.Errorf("two IPv4 service IPs: err = %v, want ErrInvalid", err)
	}
	if err := ApplyClient(pod.Path()+"-missing", oneGateway); err == nil {
		t.Errorf("a missing namespace: no error")
	}
	if _, err := NewRouter(RouterConfig{NetNS: pod.Path()}); !errors.Is(err, ErrInvalid) {
		t.Errorf("router without a local address: err = %v, want ErrInvalid", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))
}

// TestAddRulesBatch: the rules sent in one batched request are exactly
// those RuleAdd would make (findRules, which matches every field, sees
// them), and a failing one in the middle is reported while the others,
// before and after it, are added and reported as added.
func TestAddRulesBatch(t *testing.T) {
	harness.RequireRoot(t)
	pod := podNS(t)
	h, rs, _, err := openHandles(pod.Path(), false, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer rs.Close()
	all := append(clientRules(false), clientRules(true)...)
	all = append(all, rule{prio: 3000, v6: false, iif: "eth0", table: 300})
	clash := all[3]
	if err := h.RuleAdd(clash.nl()); err != nil {
		t.Fatal(err)
	}
	added, err := addRules(rs, all)
	if !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "pref 2001") {
		t.Fatalf("addRules with pref %d there already: err = %v, want EEXIST naming it", clash.prio, err)
	}
	if len(added) != len(all)-1 || slices.Contains(added, clash) {
		t.Fatalf("added = %v, want all but %v", added, clash)
	}
	have, err := findRules(h, all)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if !have[r] {
			t.Errorf("rule %+v not found after the batch", r)
		}
	}
	if added, err := addRules(rs, nil); err != nil || added != nil {
		t.Errorf("addRules of nothing = %v, %v", added, err)
	}
}

// TestEnsureSysctlsReadsFirst: a sysctl that has its value already is not
// written, so a router whose /proc/sys cannot be written (here: a
// read-only sysctl stands for one) starts when the values are preset;
// one that differs is written, and a failing write is a clear error.
func TestEnsureSysctlsReadsFirst(t *testing.T) {
	harness.RequireRoot(t)
	pod := harness.NewNS(t, "egsys")
	const ro = "net.ipv4.tcp_available_congestion_control" // mode 0444
	var cur string
	err := pod.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
		cur = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureSysctls(pod.Path(), [][2]string{{ro, cur}, {"net.ipv4.ip_forward", "1"}}); err != nil {
		t.Fatalf("ensureSysctls with the read-only one already right: %v", err)
	}
	var fwd string
	_ = pod.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		fwd = strings.TrimSpace(string(b))
		return err
	})
	if fwd != "1" {
		t.Errorf("ip_forward = %q after ensureSysctls, want 1", fwd)
	}
	err = ensureSysctls(pod.Path(), [][2]string{{ro, "bogus"}})
	if err == nil || !strings.Contains(err.Error(), ro) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("ensureSysctls writing a read-only sysctl: err = %v, want one naming it", err)
	}
	if err := ensureSysctls(pod.Path(), [][2]string{{"net.ipv4.no_such_thing", "1"}}); err == nil {
		t.Error("ensureSysctls of a missing sysctl: no error")
	}
}

// TestDumpsRetryWhenInterrupted: a dump the kernel marks interrupted
// (the table changed while it was read, as IPv6 configuring a new pod's
// interface does during its ADD) is taken again instead of failing the
// call.
func TestDumpsRetryWhenInterrupted(t *testing.T) {
	harness.RequireRoot(t)
	pod := harness.NewNS(t, "egdump")
	h, err := openHandle(pod.Path(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	d, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(d)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Enough addresses that a dump takes several reads, and a writer
	// that changes them every 100 ms (a dump takes a few ms here:
	// without the retry, some of 150 dumps are interrupted).
	for i := 0; i < 2000; i++ {
		a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(i / 200), byte(i%200 + 1)}), 32))}
		if err := h.AddrAdd(d, a); err != nil {
			t.Fatal(err)
		}
	}
	wh, err := openHandle(pod.Path(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a := &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("10.9.9.9/32"))}
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := wh.AddrAdd(d, a); err != nil && !errors.Is(err, unix.EEXIST) {
				t.Errorf("churn: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
			_ = wh.AddrDel(d, a)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer func() { close(stop); <-done }()
	for i := 0; i < 150; i++ {
		if _, err := globalFamilies(h); err != nil {
			t.Fatalf("dump %d: %v", i, err)
		}
	}
}
