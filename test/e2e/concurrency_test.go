package e2e

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// parallel runs fn(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

// TestConcurrentAddDel: many ADDs at once never hand out an address twice,
// every pod works, and as many DELs at once leave nothing behind.
func TestConcurrentAddDel(t *testing.T) {
	const pods, workers = 24, 8
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "conc", "1.1.0", nil)
	nss := make([]*harness.NS, pods)
	for i := range nss {
		nss[i] = harness.NewNS(t, "pod")
	}
	got := make([]*pod, pods)
	start := time.Now()
	parallel(pods, workers, func(i int) {
		id := fmt.Sprintf("conc-%02d", i)
		rt := skeintest.RT(id, nss[i].Path(), "eth0")
		r, err := e.add(t, l, rt)
		if err != nil {
			t.Errorf("concurrent ADD %s: expected a result, got: %v", id, err)
			return
		}
		res, err := asCurrentErr(r)
		if err != nil {
			t.Errorf("ADD %s: %v", id, err)
			return
		}
		got[i] = &pod{ns: nss[i], rt: rt, res: res, addrs: ctrAddrs(res, "eth0", nss[i].Path())}
	})
	t.Logf("%d ADDs on %d workers took %v", pods, workers, time.Since(start).Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}

	owner := map[netip.Addr]string{}
	for _, p := range got {
		if len(p.addrs) != 2 {
			t.Errorf("%s should have one address per family, has %v", p.rt.ContainerID, p.addrs)
		}
		for _, a := range p.addrs {
			if o, dup := owner[a]; dup {
				t.Errorf("address %s handed out twice: to %s and %s", a, o, p.rt.ContainerID)
			}
			owner[a] = p.rt.ContainerID
		}
	}
	if atts := e.d.Attachments(t); len(atts) != pods {
		t.Errorf("skeind should hold %d attachments, holds %d", pods, len(atts))
	}
	if links := hostLinks(t, e.d.Node); len(links) != pods {
		t.Errorf("node should have %d skein host veths, has %d", pods, len(links))
	}
	for _, pair := range [][2]int{{0, pods - 1}, {5, 17}, {pods - 1, 3}} {
		from, to := got[pair[0]], got[pair[1]]
		mustReach(t, from.ns, fmt.Sprintf("%s to %s", from.rt.ContainerID, to.rt.ContainerID), to.addrs...)
	}

	start = time.Now()
	parallel(pods, workers, func(i int) {
		if err := e.del(t, l, got[i].rt); err != nil {
			t.Errorf("concurrent DEL %s: expected success, got: %v", got[i].rt.ContainerID, err)
		}
	})
	t.Logf("%d DELs on %d workers took %v", pods, workers, time.Since(start).Round(time.Millisecond))
	e.assertNothingLeft(t)
}
