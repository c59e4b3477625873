package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// A veth delete returns from the kernel only after the kernel has waited
// for every reference to both ends to drop, which takes an RCU barrier:
// 10–20 ms here. The links vanish much earlier, under the RTNL lock and
// before that wait: they are unlisted (their names free), their
// addresses, routes and sysctl directories removed, and the kernel
// announces each as RTM_DELLINK on the link multicast group, ~0.7 ms after
// the request. Nothing a later call or a user can observe tells a link in
// that state from one freed.
//
// So Teardown does not wait for the free. The delete runs in a goroutine of
// its own, which keeps its netlink socket until the kernel answers, and
// Teardown returns when the host end's RTM_DELLINK arrives — or when the
// delete returns, whichever is first (a failed delete announces nothing).
// unlisted watches for those announcements in the node namespace.
type unlisted struct {
	sock *nl.NetlinkSocket

	mu      sync.Mutex
	waiting map[int32]chan struct{} // by ifindex: closed when announced
	closed  bool

	done sync.WaitGroup // the watch loop and the deletes in flight

	hold chan struct{} // tests: deletes report their end only once it is closed
}

// watchUnlisted subscribes, in the node namespace, to the link group's
// announcements, with a socket filter that lets only RTM_DELLINK through
// (every ADD makes several other link announcements, each of which would
// otherwise wake the watcher).
func (d *Dataplane) watchUnlisted() error {
	var s *nl.NetlinkSocket
	err := netns.Do(d.cfg.NodeNetNS, func() (err error) {
		s, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK)
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
		return fmt.Errorf("filter link announcements: %w", err)
	}
	u := &d.unlisted
	u.sock, u.waiting = s, map[int32]chan struct{}{}
	u.done.Add(1)
	go u.watch()
	return nil
}

// watch closes the channel of every announced link someone waits for,
// until the socket is closed. Announcements lost to a full socket buffer
// (ENOBUFS) only make their Teardowns wait for the delete itself.
func (u *unlisted) watch() {
	defer u.done.Done()
	for {
		msgs, _, err := u.sock.Receive()
		switch {
		case errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return // closed
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_DELLINK || len(m.Data) < unix.SizeofIfInfomsg {
				continue
			}
			idx := nl.DeserializeIfInfomsg(m.Data).Index
			u.mu.Lock()
			if c, ok := u.waiting[idx]; ok {
				close(c)
				delete(u.waiting, idx)
			}
			u.mu.Unlock()
		}
	}
}

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

// close stops the watcher and waits for the deletes in flight.
func (u *unlisted) close() {
	u.mu.Lock()
	if u.closed || u.sock == nil {
		u.mu.Unlock()
		return
	}
	u.closed = true
	u.mu.Unlock()
	u.sock.Close()
	u.done.Wait()
}

// deleteLink deletes a node link and returns once the kernel has
// unlisted it (see unlisted). Its pod end goes with it, in the same pass.
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
	result := make(chan error, 1)
	go func() {
		defer u.done.Done()
		defer put()
		err := del(h)
		if u.hold != nil {
			<-u.hold
		}
		result <- err
	}()
	select {
	case <-gone:
		return nil
	case err := <-result:
		u.forget(index, gone)
		return err
	}
}
