package routebench

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
)

// routeWatch follows the remote-block routes (routing.DefaultTable,
// routing.DefaultProtocol) of one node namespace through the kernel's
// route notifications, recording when each prefix appeared and went.
type routeWatch struct {
	node *harness.TopoNode

	mu      sync.Mutex
	added   map[netip.Prefix]time.Time // present now, since when
	removed map[netip.Prefix]time.Time // absent now, since when
	err     error
}

// watchRoutes subscribes inside n's namespace (the socket belongs to the
// namespace it is made in); the routes already there are listed first.
func watchRoutes(t testing.TB, n *harness.TopoNode) *routeWatch {
	t.Helper()
	w := &routeWatch{node: n, added: map[netip.Prefix]time.Time{}, removed: map[netip.Prefix]time.Time{}}
	ch := make(chan netlink.RouteUpdate, 1<<16)
	done := make(chan struct{})
	err := n.Do(func() error {
		return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
			ReceiveBufferSize:      32 << 20,
			ReceiveBufferForceSize: true,
			ListExisting:           true,
			ErrorCallback: func(err error) {
				w.mu.Lock()
				if w.err == nil {
					w.err = fmt.Errorf("route notifications in %s: %w", n.Name(), err)
				}
				w.mu.Unlock()
			},
		})
	})
	if err != nil {
		t.Fatalf("subscribe to routes in %s: %v", n.Name(), err)
	}
	t.Cleanup(func() { close(done) })
	go func() {
		for u := range ch {
			now := time.Now()
			if u.Table != routing.DefaultTable || u.Protocol != routing.DefaultProtocol || u.Dst == nil {
				continue
			}
			p, ok := prefixOf(u.Route)
			if !ok {
				continue
			}
			w.mu.Lock()
			switch u.Type {
			case unix.RTM_NEWROUTE:
				if _, there := w.added[p]; !there {
					w.added[p] = now
				}
				delete(w.removed, p)
			case unix.RTM_DELROUTE:
				if _, there := w.added[p]; there {
					w.removed[p] = now
				}
				delete(w.added, p)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func prefixOf(r netlink.Route) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(r.Dst.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := r.Dst.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// state returns since when p has been present (ok) or absent.
func (w *routeWatch) state(p netip.Prefix) (present bool, since time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if at, ok := w.added[p]; ok {
		return true, at, w.err
	}
	return false, w.removed[p], w.err
}

// count is how many remote-block routes are present.
func (w *routeWatch) count() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.added), w.err
}

// waitAll waits until p is present (or absent) on every watched node and
// returns the latest time it became so; limit bounds the wait.
func waitAll(ws []*routeWatch, p netip.Prefix, present bool, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		var last time.Time
		pending := ""
		for _, w := range ws {
			is, since, err := w.state(p)
			if err != nil {
				return time.Time{}, err
			}
			if is != present {
				pending = w.node.Name()
				break
			}
			if since.After(last) {
				last = since
			}
		}
		if pending == "" {
			return last, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("route %s on %s: present=%v wanted after %v", p, pending, present, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitCount waits until every watched node holds exactly n remote-block
// routes.
func waitCount(ws []*routeWatch, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		bad := ""
		for _, w := range ws {
			c, err := w.count()
			if err != nil {
				return err
			}
			if c != n {
				bad = fmt.Sprintf("%s holds %d routes", w.node.Name(), c)
				break
			}
		}
		if bad == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s, want %d, after %v", bad, n, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
