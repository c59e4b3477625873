package vm

import (
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/vm"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// BenchmarkDHCPLease times udhcpc's lease, first DISCOVER to ACK as seen
// on the client's wire, from skein-vm's DHCP server and from dnsmasq
// serving the same kind of lease (one static host) in the same kind of
// namespace, alternately in one run. One iteration is one lease from each;
// run it with -benchtime=100x for the 100-lease comparison. Reported:
// medians and 90th percentiles in ms.
//
//	go test -run '^$' -bench DHCPLease -benchtime=100x ./test/vm/
func BenchmarkDHCPLease(b *testing.B) {
	skeintest.RequireTool(b, "udhcpc")
	dnsmasq := skeintest.RequireTool(b, "dnsmasq")

	// skein: a pod through skein + skein-vm, a VM stand-in on its bridge.
	e := newEnv(b)
	p := e.mustAddVM(b, e.skeinChain(b, "vm-bench", "1.1.0", nil), "bench")
	skeinVM, skeinIf := p.vmSide(b)

	// dnsmasq: a pod namespace with a bridge holding the gateway address,
	// the same stand-in, dnsmasq bound to the bridge.
	dPod, dVM, dIf := dnsmasqPod(b, p.vmMAC)
	dir := b.TempDir()
	cmd := exec.Command(dnsmasq, "--no-daemon", "--conf-file=/dev/null", "--port=0", "--user=root",
		"--interface=dmbr0", "--bind-interfaces", "--dhcp-authoritative", "--no-ping",
		"--dhcp-range=10.99.0.0,static,255.255.255.0", "--dhcp-host="+p.vmMAC+",10.99.0.5",
		"--pid-file="+filepath.Join(dir, "pid"), "--dhcp-leasefile="+filepath.Join(dir, "leases"), "--log-facility=-")
	var dout strings.Builder
	cmd.Stdout, cmd.Stderr = &dout, &dout
	if err := dPod.Do(cmd.Start); err != nil {
		b.Fatalf("start dnsmasq: %v", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	var skeinT, dnsmasqT []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		skeinT = append(skeinT, timeLease(b, skeinVM, skeinIf))
		dnsmasqT = append(dnsmasqT, timeLease(b, dVM, dIf))
	}
	b.StopTimer()
	if b.Failed() {
		b.Logf("dnsmasq output:\n%s", dout.String())
	}
	med, p90 := quantiles(skeinT)
	dmed, dp90 := quantiles(dnsmasqT)
	b.ReportMetric(ms(med), "skein-ms/lease")
	b.ReportMetric(ms(p90), "skein-p90-ms")
	b.ReportMetric(ms(dmed), "dnsmasq-ms/lease")
	b.ReportMetric(ms(dp90), "dnsmasq-p90-ms")
	b.Logf("%d leases each: skein-vm median %v p90 %v; dnsmasq median %v p90 %v",
		len(skeinT), med, p90, dmed, dp90)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantiles(ds []time.Duration) (median, p90 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*9/10]
}

// dnsmasqPod builds the contender's namespaces: "pod" with bridge dmbr0
// (10.99.0.1/24) and a port to a "vm" namespace whose interface has mac.
func dnsmasqPod(b *testing.B, mac string) (pod, vmNS *harness.NS, ifName string) {
	b.Helper()
	pod, vmNS = harness.NewNS(b, "dmpod"), harness.NewNS(b, "dmvm")
	h := pod.Handle(b)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "dmbr0", MTU: podMTU, TxQLen: -1}}
	if err := h.LinkAdd(br); err != nil {
		b.Fatal(err)
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 99, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		b.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		b.Fatal(err)
	}
	hw, _ := net.ParseMAC(mac)
	ifName = "dmvm0"
	pod.AddVeth(b, harness.Veth{Name: "dmport", PeerName: ifName, Peer: vmNS, MTU: podMTU, Master: br.Index, PeerMAC: hw})
	return pod, vmNS, ifName
}

// timeLease runs udhcpc once (it quits once bound, configuring nothing)
// while a packet socket on the client's interface timestamps the first
// DISCOVER out and the ACK in.
func timeLease(b *testing.B, ns *harness.NS, ifName string) time.Duration {
	b.Helper()
	var fd, ifindex int
	err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		ifindex = ifc.Index
		// ETH_P_ALL: only such sockets see outgoing frames too.
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		b.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)

	type stamp struct {
		mt dhcpv4.MessageType
		at time.Time
	}
	stamps := make(chan stamp, 16)
	stop := make(chan struct{})
	go func() {
		buf := make([]byte, 2048)
		for {
			select {
			case <-stop:
				close(stamps)
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			at := time.Now()
			if err != nil {
				continue
			}
			f, err := vm.ParseFrame(buf[:n], true)
			if err != nil || (f.DstPort != 67 && f.DstPort != 68) {
				continue
			}
			if m, err := dhcpv4.FromBytes(f.Payload); err == nil {
				select {
				case stamps <- stamp{m.MessageType(), at}:
				default:
				}
			}
		}
	}()
	out, err := run(b, ns, 20*time.Second, "udhcpc", "-f", "-q", "-n", "-i", ifName, "-s", "/bin/true", "-t", "5", "-T", "1")
	close(stop)
	if err != nil {
		b.Fatalf("udhcpc: %v\n%s", err, out)
	}
	var discover, ack time.Time
	for s := range stamps {
		switch {
		case s.mt == dhcpv4.MessageTypeDiscover && discover.IsZero():
			discover = s.at
		case s.mt == dhcpv4.MessageTypeAck && ack.IsZero():
			ack = s.at
		}
	}
	if discover.IsZero() || ack.IsZero() {
		b.Fatalf("did not see both DISCOVER and ACK on the wire (udhcpc said: %s)", out)
	}
	return ack.Sub(discover)
}
