package dataplane

import (
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
)

// handlePool lends node-namespace netlink sockets to attachment operations.
//
// A netlink.Handle holds its socket for the whole of each request, and a
// veth delete keeps its request open for tens of milliseconds; with one
// shared socket every ADD would queue behind every DEL. With a socket per
// caller, operations only meet at the kernel's own locks. Sockets are kept
// for reuse (opening one in another namespace costs a namespace switch).
type handlePool struct {
	mu   sync.Mutex
	free []pooledHandle
}

type pooledHandle struct {
	h     *netlink.Handle
	close func()
}

// maxIdleHandles bounds the sockets kept open between bursts.
const maxIdleHandles = 32

// acquire returns a node-namespace handle for the caller's exclusive use
// and the function that gives it back.
func (d *Dataplane) acquire() (*netlink.Handle, func(), error) {
	p := &d.pool
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		ph := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return ph.h, func() { p.put(ph) }, nil
	}
	p.mu.Unlock()
	h, closeH, err := netns.Handle(d.cfg.NodeNetNS)
	if err != nil {
		return nil, nil, err
	}
	ph := pooledHandle{h: h, close: closeH}
	return h, func() { p.put(ph) }, nil
}

func (p *handlePool) put(ph pooledHandle) {
	p.mu.Lock()
	if len(p.free) < maxIdleHandles {
		p.free = append(p.free, ph)
		ph = pooledHandle{}
	}
	p.mu.Unlock()
	if ph.close != nil {
		ph.close()
	}
}

func (p *handlePool) close() {
	p.mu.Lock()
	free := p.free
	p.free = nil
	p.mu.Unlock()
	for _, ph := range free {
		ph.close()
	}
}
