package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/unixsock"
	"github.com/skeinnet/skein/internal/vm/handover"
)

// fdServer hands open tap descriptors to VM launchers (package handover
// has the protocol). Each request is answered on its own goroutine; the
// taps are opened for the request and skeind's copies closed once sent,
// so skeind holds no tap open and a VM that exits frees its tap for the
// next one.
type fdServer struct {
	l    *unixsock.Listener
	open func(req handover.Request, netns *os.File) ([]handover.Interface, []*os.File, error)
	log  *slog.Logger
	wg   sync.WaitGroup
}

func listenFD(path string, open func(handover.Request, *os.File) ([]handover.Interface, []*os.File, error), log *slog.Logger) (*fdServer, error) {
	l, err := unixsock.Listen("unixpacket", path) // mode 0600 from the start
	if err != nil {
		return nil, fmt.Errorf("VM socket: %w", err)
	}
	s := &fdServer{l: l, open: open, log: log}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *fdServer) close() {
	s.l.Close()
	s.wg.Wait()
}

func (s *fdServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("vm socket: accept", "err", err)
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			s.answer(c)
		}()
	}
}

func (s *fdServer) answer(c *net.UnixConn) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	peer := peerOf(c)
	buf := make([]byte, handover.MaxMessage)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		s.log.Warn("vm socket: read request", "peer", peer, "err", err)
		return
	}
	// Whatever descriptors came are closed here; at most one (a network
	// namespace) is used.
	sent, rerr := handover.ParseRights(oob[:oobn])
	defer func() {
		for _, f := range sent {
			f.Close()
		}
	}()
	var req handover.Request
	var resp handover.Response
	var files []*os.File
	switch {
	case flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0:
		resp.Error = "request or its descriptors truncated"
	case rerr != nil:
		resp.Error = "malformed request: " + rerr.Error()
	case json.Unmarshal(buf[:n], &req) != nil:
		resp.Error = "malformed request: not JSON"
	case req.NetNS && len(sent) != 1:
		resp.Error = fmt.Sprintf("a request by network namespace carries one descriptor, not %d", len(sent))
	case !req.NetNS && len(sent) != 0:
		resp.Error = "a request by container ID carries no descriptor"
	default:
		var ns *os.File
		if req.NetNS {
			ns = sent[0]
		}
		if ifs, fs, err := s.open(req, ns); err != nil {
			resp.Error = err.Error()
		} else {
			resp.Interfaces, files = ifs, fs
		}
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	b, _ := json.Marshal(resp)
	var rights []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		rights = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, rights, nil)
	// skeind's copies go before the connection closes (serve closes it
	// when answer returns): the launcher waits for that, so it holds the
	// taps alone, and a tap takes one holder.
	for _, f := range files {
		f.Close()
	}
	files = nil
	if err != nil {
		s.log.Warn("vm socket: send response", "peer", peer, "err", err)
		return
	}
	if resp.Error != "" {
		s.log.Warn("vm socket: refused", "peer", peer, "container", req.ContainerID, "byNetNS", req.NetNS, "err", resp.Error)
		return
	}
	s.log.Info("vm socket: taps handed over", "peer", peer, "container", req.ContainerID, "byNetNS", req.NetNS, "taps", len(files))
}

// peerOf describes the connecting process for the log.
func peerOf(c *net.UnixConn) string {
	rc, err := c.SyscallConn()
	if err != nil {
		return "?"
	}
	var cred *unix.Ucred
	_ = rc.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return "?"
	}
	return fmt.Sprintf("pid=%d uid=%d", cred.Pid, cred.Uid)
}
