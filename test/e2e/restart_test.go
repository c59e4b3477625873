package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestRestart: attachments outlive skeind. After a restart (graceful or a
// crash between requests) CHECK still passes, traffic flows, a new ADD gets
// an address nobody holds and every DEL works.
func TestRestart(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	for _, how := range []string{"stop", "kill"} {
		t.Run(how, func(t *testing.T) {
			l := e.list(t, "restart-"+how, "1.1.0", nil)
			a := e.mustAdd(t, l, harness.NewNS(t, "pod"), "a")
			b := e.mustAdd(t, l, harness.NewNS(t, "pod"), "b")
			if how == "stop" {
				e.d.Stop(t)
			} else {
				e.d.Kill(t)
			}
			e.d.Start(t)
			for _, p := range []*pod{a, b} {
				if err := e.check(t, l, p.rt); err != nil {
					t.Errorf("CHECK %s after skeind restarted (%s): expected success, got: %v", p.rt.ContainerID, how, err)
				}
			}
			mustReach(t, a.ns, "pod a to pod b after restart", b.addrs...)
			c := e.mustAdd(t, l, harness.NewNS(t, "pod"), "c")
			for _, ad := range c.addrs {
				if slices.Contains(a.addrs, ad) || slices.Contains(b.addrs, ad) {
					t.Errorf("ADD after restart got %s, already held by a pod from before the restart (a %v, b %v)", ad, a.addrs, b.addrs)
				}
			}
			for _, p := range []*pod{a, b, c} {
				e.mustDel(t, l, p.rt)
			}
			e.assertNothingLeft(t)
		})
	}
}

type churnState int

const (
	dead    churnState = iota // never added, or last successful call was DEL
	live                      // last successful call was ADD
	unknown                   // a call was cut short by the crash
)

// TestCrashMidChurn: skeind is killed while four workers ADD and DEL pods.
// After the restart no address is held twice and every attachment whose ADD
// succeeded is still there; GC with exactly those as valid leaves exactly
// them (records and host links) — whatever the interrupted calls had done
// is gone — and a new ADD gets a free address.
func TestCrashMidChurn(t *testing.T) {
	const pods, workers = 20, 4
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "churn", "1.1.0", nil)
	nss := make([]*harness.NS, pods)
	for i := range nss {
		nss[i] = harness.NewNS(t, "pod")
	}
	rtOf := func(i int) *libcni.RuntimeConf {
		return skeintest.RT(fmt.Sprintf("churn-%02d", i), nss[i].Path(), "eth0")
	}

	// Pod i belongs to worker i%workers alone, so its calls never overlap.
	states := make([]churnState, pods)
	hosts := make([]string, pods) // host veth of the last successful ADD
	var killed atomic.Bool
	var ops atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	seed := uint64(time.Now().UnixNano())
	t.Logf("churn seed %d", seed)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := w + workers*rng.IntN(pods/workers)
				var err error
				var res types.Result
				if states[i] == live {
					err = e.del(t, l, rtOf(i))
				} else {
					res, err = e.add(t, l, rtOf(i))
				}
				if err != nil {
					states[i] = unknown
					if !killed.Load() {
						t.Errorf("churn on %s failed before skeind was killed: %v", rtOf(i).ContainerID, err)
					}
					return // skeind is gone (or broken): this worker is done
				}
				ops.Add(1)
				if res != nil {
					states[i] = live
					if r, err := asCurrentErr(res); err == nil && len(r.Interfaces) > 0 {
						hosts[i] = r.Interfaces[0].Name
					}
				} else {
					states[i] = dead
				}
			}
		}()
	}
	time.Sleep(time.Second)
	killed.Store(true)
	e.d.Kill(t)
	close(stop)
	wg.Wait()
	var confirmed []string
	var confirmedHosts []string
	var valid []types.GCAttachment
	counts := map[churnState]int{}
	for i, s := range states {
		counts[s]++
		if s == live {
			confirmed = append(confirmed, "churn/"+rtOf(i).ContainerID+"/eth0")
			confirmedHosts = append(confirmedHosts, hosts[i])
			valid = append(valid, types.GCAttachment{ContainerID: rtOf(i).ContainerID, IfName: "eth0"})
		}
	}
	slices.Sort(confirmedHosts)
	t.Logf("killed skeind after %d successful calls: %d pods live, %d dead, %d cut short", ops.Load(), counts[live], counts[dead], counts[unknown])
	if ops.Load() == 0 {
		t.Fatal("no churn call succeeded before the kill")
	}

	e.d.Start(t)
	if u := untaggedLinks(t, e.d.Node); len(u) > 0 {
		t.Errorf("after the restart the node has host veths without skein's alias: %v. An ADD cut short between "+
			"creating the veth and tagging it leaves one; DEL and GC refuse to delete an untagged link and reconcile does not see it, "+
			"so it (and, if the record was written, its addresses) can never be released", u)
	}
	atts := e.d.Attachments(t)
	holder := map[string]string{}
	for _, a := range atts {
		for _, ad := range a.Addresses {
			if h, dup := holder[ad]; dup {
				t.Errorf("after the crash address %s is held twice: by %s and %s", ad, h, a.ContainerId)
			}
			holder[ad] = a.ContainerId
		}
	}
	have := attKeys(atts)
	for _, k := range confirmed {
		if !slices.Contains(have, k) {
			t.Errorf("attachment %s was ADDed successfully before the crash but skeind lost it (holds %v)", k, have)
		}
	}

	if err := e.freshRuntime(t).GCNetworkList(ctx(t), l, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		t.Errorf("GC after the crash: expected success, got: %v", err)
	}
	if got := attKeys(e.d.Attachments(t)); !slices.Equal(got, confirmed) {
		t.Errorf("after GC skeind should hold exactly the confirmed-live attachments\n  want %v\n  have %v", confirmed, got)
	}
	if got := hostLinks(t, e.d.Node); !slices.Equal(got, confirmedHosts) {
		t.Errorf("after GC the node should have exactly the host veths of the confirmed-live attachments\n  want %v\n  have %v", confirmedHosts, got)
	}
	for i, s := range states {
		if s == live {
			if err := e.check(t, l, rtOf(i)); err != nil {
				t.Errorf("CHECK of %s, live across the crash: expected success, got: %v", rtOf(i).ContainerID, err)
			}
		}
	}

	// A new pod gets an address nobody holds.
	fresh := e.mustAdd(t, l, harness.NewNS(t, "pod"), "after-crash")
	held := map[netip.Addr]bool{}
	for _, a := range e.d.Attachments(t) {
		if a.ContainerId == "after-crash" {
			continue
		}
		for _, ad := range a.Addresses {
			held[netip.MustParseAddr(ad)] = true
		}
	}
	for _, a := range fresh.addrs {
		if held[a] {
			t.Errorf("ADD after the crash got %s, which another attachment holds", a)
		}
	}
	for i := range nss {
		e.mustDel(t, l, rtOf(i)) // DEL is idempotent: also for dead and cut-short pods
	}
	e.mustDel(t, l, fresh.rt)
	e.assertNothingLeft(t)
}
