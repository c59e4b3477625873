package vm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Server is the DHCP (v4 and v6) and router-advertisement server of one VM
// port: one goroutine reading one packet socket, opened inside the pod
// namespace on the port's bridge.
//
// Why a packet socket on the bridge rather than a UDP socket (as the
// library's server4/server6 use): the bridge has no IP address — the VM's
// address is the one the container would have had, and the pod's stack
// must not answer for it — so there is nothing for a UDP socket to be
// bound to and no source address for its replies; and a client renews by
// unicast to the server identifier (the gateway), a frame addressed to the
// gateway's MAC that the bridge forwards to the veth instead of delivering
// it locally. The socket asks for promiscuous mode, in which the bridge
// hands the host side a copy of every frame it forwards; a BPF filter
// keeps only DHCP and router solicitations; the nftables filter drops the
// forwarded copy at the veth. Replies are whole frames sent on the bridge,
// Ethernet-unicast to the VM's MAC (RFC 2131 allows unicast to chaddr),
// so they reach a client that has no address yet without flooding.
type Server struct {
	lease     Lease
	vmMAC     net.HardwareAddr
	bridgeMAC net.HardwareAddr
	ownLL     netip.Addr
	duid      dhcpv6.DUID
	ifindex   int
	f         *os.File
	rc        syscall.RawConn
	log       *slog.Logger
	done      chan struct{}
	wg        sync.WaitGroup
	stats     Stats
	// RAInterval is the period of unsolicited router advertisements.
	raInterval time.Duration
	// solicitedRA and badRequest bound the answers a guest can provoke
	// (see ratelimit.go); used by the serving goroutine only.
	solicitedRA, badRequest *bucket
	// warnings bounds the socket errors logged (a guest can provoke one
	// per frame: a reply too long for the link); under warnMu.
	warnMu   sync.Mutex
	warnings *bucket
}

// warn logs a socket error, at most warningLimit of them; the others are
// counted in Stats.SocketErrors only.
func (s *Server) warn(msg string, err error) {
	s.stats.SocketErrors.Add(1)
	s.warnMu.Lock()
	ok := s.warnings.allow(time.Now())
	s.warnMu.Unlock()
	if ok {
		s.log.Warn(msg, "err", err, "socketErrors", s.stats.SocketErrors.Load())
	}
}

// Stats counts what a Server did. Safe to read while it runs.
type Stats struct {
	Offers, Acks, Naks, Replies6, Adverts, Dropped, Malformed atomic.Int64
	// Limited counts answers not sent because of a rate limit.
	Limited atomic.Int64
	// SocketErrors counts failed reads and sends.
	SocketErrors atomic.Int64
}

// StartServer opens the socket in the pod namespace and starts serving
// lease on the port's bridge. Stop it with Close.
func StartServer(nsPath string, p Port, log *slog.Logger) (*Server, error) {
	vmMAC, err := net.ParseMAC(p.Lease.MAC)
	if err != nil {
		return nil, fmt.Errorf("VM MAC %q: %w", p.Lease.MAC, err)
	}
	var fd, ifindex int
	var brMAC net.HardwareAddr
	err = netns.Do(nsPath, func() error {
		ifc, err := net.InterfaceByName(p.Bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", p.Bridge, err)
		}
		ifindex, brMAC = ifc.Index, ifc.HardwareAddr
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := setupSocket(fd, ifindex); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet socket on %s: %w", p.Bridge, err)
	}
	f := os.NewFile(uintptr(fd), "packet:"+p.Bridge)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &Server{
		lease: p.Lease, vmMAC: vmMAC, bridgeMAC: brMAC, ownLL: LinkLocal(brMAC), duid: ServerDUID(brMAC),
		ifindex: ifindex, f: f, rc: rc, done: make(chan struct{}), raInterval: 200 * time.Second,
		solicitedRA: newBucket(solicitedRALimit), badRequest: newBucket(badRequestLimit), warnings: newBucket(warningLimit),
		log: log.With("bridge", p.Bridge, "vm_mac", p.Lease.MAC),
	}
	s.wg.Add(1)
	go s.serve()
	if s.lease.Addr6.IsValid() {
		s.wg.Add(1)
		go s.advertise()
	}
	return s, nil
}

// setupSocket filters before it binds, so no unwanted frame is queued.
func setupSocket(fd, ifindex int) error {
	prog, err := bpf.Assemble(dhcpFilter)
	if err != nil {
		return err
	}
	raw := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		raw[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(raw)), Filter: &raw[0]}); err != nil {
		return fmt.Errorf("attach filter: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	// Frames the pod's own stack or a local VM stand-in sent may carry a
	// checksum left for offload; the kernel says so in PACKET_AUXDATA.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
		return fmt.Errorf("auxdata: %w", err)
	}
	mreq := &unix.PacketMreq{Ifindex: int32(ifindex), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq); err != nil {
		return fmt.Errorf("promiscuous mode: %w", err)
	}
	return nil
}

// dhcpFilter accepts IPv4 UDP to port 67 (unfragmented), IPv6 UDP to port
// 547 and ICMPv6 router solicitations, each without VLAN tag or IPv6
// extension headers; everything else stays in the kernel.
var dhcpFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},                                   // 0: ethertype
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: etherTypeIPv4, SkipFalse: 7},    // 1 → 9
	bpf.LoadAbsolute{Off: 23, Size: 1},                                   // 2: IPv4 protocol
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: protoUDP, SkipFalse: 14},        // 3 → drop
	bpf.LoadAbsolute{Off: 20, Size: 2},                                   // 4: flags+fragment offset
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipTrue: 12},         // 5 → drop (MF or offset)
	bpf.LoadMemShift{Off: 14},                                            // 6: X = IPv4 header length
	bpf.LoadIndirect{Off: 16, Size: 2},                                   // 7: UDP destination port
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 67, SkipTrue: 8, SkipFalse: 9},  // 8 → accept / drop
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: etherTypeIPv6, SkipFalse: 8},    // 9 → drop
	bpf.LoadAbsolute{Off: 20, Size: 1},                                   // 10: next header
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: protoUDP, SkipFalse: 2},         // 11 → 14
	bpf.LoadAbsolute{Off: 56, Size: 2},                                   // 12: UDP destination port
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 547, SkipTrue: 3, SkipFalse: 4}, // 13 → accept / drop
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: protoICMPv6, SkipFalse: 3},      // 14 → drop
	bpf.LoadAbsolute{Off: 54, Size: 1},                                   // 15: ICMPv6 type
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 133, SkipFalse: 1},              // 16 → drop
	bpf.RetConstant{Val: 0xffff},                                         // 17: accept
	bpf.RetConstant{Val: 0},                                              // 18: drop
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Close stops the server and waits for its goroutines; the socket (and
// with it the bridge's promiscuous mode) goes away.
func (s *Server) Close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.f.Close()
	s.wg.Wait()
}

// Stats returns the server's counters.
func (s *Server) Stats() *Stats { return &s.stats }

func (s *Server) serve() {
	defer s.wg.Done()
	buf := make([]byte, MaxFrame+1)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.TpacketAuxdata{}))))
	for {
		var n, oobn int
		var from unix.Sockaddr
		var rerr error
		err := s.rc.Read(func(fd uintptr) bool {
			n, oobn, _, from, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_TRUNC)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err != nil {
			return // closed
		}
		if rerr != nil {
			if errors.Is(rerr, unix.EINTR) {
				continue
			}
			// Not the end: the bridge going down reports ENETDOWN once,
			// and the socket serves again once it is up.
			s.warn("dhcp: read", rerr)
			select {
			case <-s.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if sll, ok := from.(*unix.SockaddrLinklayer); ok && sll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own replies
		}
		if n > MaxFrame {
			s.stats.Malformed.Add(1)
			s.log.Debug("dhcp: dropped oversized frame", "bytes", n)
			continue
		}
		s.handle(buf[:n], checksumPartial(oob[:oobn]))
	}
}

// checksumPartial reads PACKET_AUXDATA: whether the frame's transport
// checksum was left to offload (TP_STATUS_CSUMNOTREADY).
func checksumPartial(oob []byte) bool {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= 4 {
			status := binary.NativeEndian.Uint32(m.Data)
			return status&unix.TP_STATUS_CSUMNOTREADY != 0
		}
	}
	return false
}

// handle answers one frame. It never panics on bad input: every parser it
// calls returns errors, and a recover turns anything unforeseen in the
// library's decoders into a dropped packet rather than a dead skeind.
func (s *Server) handle(frame []byte, partialL4 bool) {
	defer func() {
		if r := recover(); r != nil {
			s.stats.Malformed.Add(1)
			s.log.Warn("dhcp: dropped a packet that broke the decoder", "panic", r)
		}
	}()
	f, err := ParseFrame(frame, partialL4)
	if err != nil {
		s.stats.Malformed.Add(1)
		s.log.Debug("dhcp: dropped", "why", err)
		return
	}
	if !bytes.Equal(f.SrcMAC, s.vmMAC) {
		s.stats.Dropped.Add(1)
		s.log.Debug("dhcp: dropped a frame from a foreign MAC", "src", f.SrcMAC)
		return
	}
	switch {
	case f.Src.Is4() && f.Proto == protoUDP && f.DstPort == 67:
		s.handle4(f)
	case f.Src.Is6() && f.Proto == protoUDP && f.DstPort == 547:
		s.handle6(f)
	case f.Src.Is6() && f.Proto == protoICMPv6 && f.Payload[0] == 133 && f.HopLimit == 255:
		if !s.solicitedRA.allow(time.Now()) {
			s.stats.Limited.Add(1)
			return
		}
		dst := f.Src
		if dst.IsUnspecified() {
			dst = allNodes
		}
		s.sendRA(dst)
	default:
		s.stats.Dropped.Add(1)
	}
}

var allNodes = netip.MustParseAddr("ff02::1")

func (s *Server) handle4(f Frame) {
	req, err := dhcpv4.FromBytes(f.Payload)
	if err != nil {
		s.stats.Malformed.Add(1)
		s.log.Debug("dhcp: dropped undecodable DHCPv4", "err", err)
		return
	}
	rep, why := Answer4(&s.lease, req)
	if rep == nil {
		s.stats.Dropped.Add(1)
		s.log.Debug("dhcp: no answer", "type", req.MessageType(), "why", why)
		return
	}
	switch rep.Msg.MessageType() {
	case dhcpv4.MessageTypeOffer:
		s.stats.Offers.Add(1)
	case dhcpv4.MessageTypeAck:
		s.stats.Acks.Add(1)
	case dhcpv4.MessageTypeNak:
		if !s.badRequest.allow(time.Now()) {
			s.stats.Limited.Add(1)
			return
		}
		s.stats.Naks.Add(1)
		s.log.Info("dhcp: NAK", "why", rep.Msg.Message())
	}
	s.log.Debug("dhcp: reply", "request", req.MessageType(), "reply", rep.Msg.MessageType(), "yiaddr", rep.Msg.YourIPAddr, "dst", rep.Dst)
	s.send(BuildUDP(s.bridgeMAC, s.vmMAC, s.lease.ServerID4(), rep.Dst, 67, 68, rep.Msg.ToBytes()))
}

func (s *Server) handle6(f Frame) {
	req, err := dhcpv6.MessageFromBytes(f.Payload)
	if err != nil {
		s.stats.Malformed.Add(1)
		s.log.Debug("dhcp: dropped undecodable DHCPv6", "err", err)
		return
	}
	rep, why := Answer6(&s.lease, s.duid, req)
	if rep == nil {
		s.stats.Dropped.Add(1)
		s.log.Debug("dhcpv6: no answer", "type", req.Type(), "why", why)
		return
	}
	if st := rep.Options.Status(); st != nil && st.StatusCode != iana.StatusSuccess && !s.badRequest.allow(time.Now()) {
		s.stats.Limited.Add(1)
		return
	}
	s.stats.Replies6.Add(1)
	s.log.Debug("dhcpv6: reply", "request", req.Type(), "reply", rep.Type())
	s.send(BuildUDP(s.bridgeMAC, s.vmMAC, s.ownLL, f.Src, 547, 546, rep.ToBytes()))
}

// advertise sends router advertisements: a few at start (the VM may be
// booting), then every raInterval. Router solicitations get one at once.
func (s *Server) advertise() {
	defer s.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		s.sendRA(allNodes)
		next := s.raInterval
		if i < 3 {
			next = 4 * time.Second
		}
		t.Reset(next)
	}
}

func (s *Server) sendRA(dst netip.Addr) {
	src, _ := s.lease.Router6(s.ownLL)
	s.stats.Adverts.Add(1)
	s.send(BuildICMP6(s.bridgeMAC, s.vmMAC, src, dst, s.lease.RouterAdvert(s.ownLL)))
}

func (s *Server) send(frame []byte) {
	to := &unix.SockaddrLinklayer{Ifindex: s.ifindex, Halen: 6}
	copy(to.Addr[:], s.vmMAC)
	var werr error
	err := s.rc.Write(func(fd uintptr) bool {
		werr = unix.Sendto(int(fd), frame, 0, to)
		return !errors.Is(werr, unix.EAGAIN)
	})
	if err == nil {
		err = werr
	}
	if err != nil && !errors.Is(err, os.ErrClosed) {
		s.warn("dhcp: send", err)
	}
}
