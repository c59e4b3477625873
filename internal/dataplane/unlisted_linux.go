package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// A veth delete returns from the kernel only after the kernel has waited
// for every reference to both ends to drop, behind an RCU barrier: 10–20
// ms here. The pair vanishes much earlier, under the RTNL lock and before
// that wait: both ends are closed and unlisted (their names and indexes
// free), then each end in turn has its addresses, routes, neighbours and
// sysctl directories removed and is announced as RTM_DELLINK on the link
// multicast group — the host end first, ~0.7 ms after the request — and
// only then is the lock released and the wait begun.
//
// So Teardown does not wait for the free. The delete runs in a goroutine of
// its own, which keeps its netlink socket until the kernel answers.
// Teardown waits for the host end's announcement, then for the RTNL lock
// (a request that changes nothing, which the kernel serves only once the
// unregistering of both ends is over), and returns: nothing of the pair is
// left for netlink, procfs or sysfs to show, or for a new pair with the
// same names and addresses to meet. If the delete fails, or its
// announcement is lost (a full socket buffer), Teardown waits for the
// delete's own answer instead. unlisted watches for the announcements in
// the node namespace.
type unlisted struct {
	sock    *nl.NetlinkSocket // subscribed to RTNLGRP_LINK, RTM_DELLINK only
	barrier *nl.SocketHandle  // for the no-op request that waits for RTNL
	slots   chan struct{}     // deletes in flight, at most cap(slots)

	mu      sync.Mutex
	waiting map[int32]chan struct{} // by ifindex: closed when announced
	closed  bool

	done sync.WaitGroup // the watch loop and the deletes in flight

	hold chan struct{} // tests: deletes report their end only once it is closed
}

const (
	// maxDeletesInFlight bounds the deletes still waiting for the kernel's
	// free (each holds a thread and a socket); Teardowns beyond it wait.
	maxDeletesInFlight = 64
	// closeWait bounds how long Close waits for deletes in flight: a
	// device whose references never drop keeps its delete forever.
	closeWait = 5 * time.Second
)

// watchUnlisted subscribes, in the node namespace, to the link group's
// announcements, with a socket filter that lets only RTM_DELLINK through
// (every ADD makes several other link announcements, each of which would
// otherwise wake the watcher), and opens the barrier's socket.
func (d *Dataplane) watchUnlisted() error {
	var s, b *nl.NetlinkSocket
	err := netns.Do(d.cfg.NodeNetNS, func() (err error) {
		if s, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK); err != nil {
			return err
		}
		if b, err = nl.GetNetlinkSocketAt(vns.None(), vns.None(), unix.NETLINK_ROUTE); err != nil {
			s.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("subscribe to link announcements: %w", err)
	}
	// nlmsg_type is 16 bits at offset 4, in host order; classic BPF loads
	// it in network order.
	var t [2]byte
	binary.NativeEndian.PutUint16(t[:], unix.RTM_DELLINK)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(binary.BigEndian.Uint16(t[:]))},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if err := unix.SetsockoptSockFprog(s.GetFd(), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		s.Close()
		b.Close()
		return fmt.Errorf("filter link announcements: %w", err)
	}
	u := &d.unlisted
	u.sock, u.barrier = s, &nl.SocketHandle{Socket: b}
	u.slots, u.waiting = make(chan struct{}, maxDeletesInFlight), map[int32]chan struct{}{}
	u.done.Add(1)
	go u.watch()
	return nil
}

// watch closes the channel of every announced link someone waits for,
// until the socket is closed. Only the kernel's own announcements of a
// link (family AF_UNSPEC; a bridge announces a port leaving it as an
// AF_BRIDGE RTM_DELLINK of the same index) count. Announcements lost to a
// full socket buffer, or to errors, only make their Teardowns wait for
// the delete itself; after maxWatchErrors errors in a row the watcher
// stops, and every later Teardown waits for its delete.
func (u *unlisted) watch() {
	defer u.done.Done()
	for errs := 0; errs < maxWatchErrors; {
		msgs, from, err := u.sock.Receive()
		switch {
		case errors.Is(err, os.ErrClosed):
			return
		case errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			errs++
			continue
		}
		errs = 0
		if from.Pid != nl.PidKernel {
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_DELLINK || len(m.Data) < unix.SizeofIfInfomsg {
				continue
			}
			info := nl.DeserializeIfInfomsg(m.Data)
			if info.Family != unix.AF_UNSPEC {
				continue
			}
			u.mu.Lock()
			if c, ok := u.waiting[info.Index]; ok {
				close(c)
				delete(u.waiting, info.Index)
			}
			u.mu.Unlock()
		}
	}
}

const maxWatchErrors = 100

// expect returns a channel closed when link index is announced deleted,
// and counts a delete in flight; nil once closed (no one watches).
func (u *unlisted) expect(index int) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil
	}
	u.done.Add(1)
	c, ok := u.waiting[int32(index)]
	if !ok {
		c = make(chan struct{})
		u.waiting[int32(index)] = c
	}
	return c
}

// forget drops the wait for index (its delete ended without an
// announcement being seen).
func (u *unlisted) forget(index int, c chan struct{}) {
	u.mu.Lock()
	if u.waiting[int32(index)] == c {
		delete(u.waiting, int32(index))
	}
	u.mu.Unlock()
}

// awaitRTNL returns once the kernel has served a request that takes the
// RTNL lock and changes nothing (RTM_SETLINK of lo, index 1, without
// attributes: no change, no announcement).
func (u *unlisted) awaitRTNL() error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: u.barrier}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = 1
	req.AddData(msg)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// close stops the watcher and waits, closeWait at most, for the deletes
// in flight.
func (u *unlisted) close() {
	u.mu.Lock()
	if u.closed || u.sock == nil {
		u.mu.Unlock()
		return
	}
	u.closed = true
	u.mu.Unlock()
	u.sock.Close()
	waited := make(chan struct{})
	go func() { u.done.Wait(); close(waited) }()
	select {
	case <-waited:
		u.barrier.Socket.Close()
	case <-time.After(closeWait):
	}
}

// deleteLink deletes a node link and returns once the kernel has
// unregistered it and its pod end (see unlisted).
func (d *Dataplane) deleteLink(link netlink.Link) error {
	u := &d.unlisted
	index := link.Attrs().Index
	gone := u.expect(index)
	del := func(h *netlink.Handle) error {
		if err := h.LinkDel(link); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete %s: %w", link.Attrs().Name, err)
		}
		return nil
	}
	h, put, err := d.acquire()
	switch {
	case err != nil:
		if gone != nil {
			u.forget(index, gone)
			u.done.Done()
		}
		return err
	case gone == nil: // closed: no one watches
		defer put()
		return del(h)
	}
	u.slots <- struct{}{}
	result := make(chan error, 1)
	go func() {
		defer u.done.Done()
		defer func() { <-u.slots }()
		defer put()
		err := del(h)
		if u.hold != nil {
			<-u.hold
		}
		result <- err
	}()
	select {
	case <-gone:
		if u.awaitRTNL() == nil {
			return nil
		}
		return <-result
	case err := <-result:
		u.forget(index, gone)
		return err
	}
}
