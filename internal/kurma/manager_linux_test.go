package kurma_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
)

const uuid1 = "146d7cef-fbf6-41da-a2f8-eba218597f9c"

// TestAttachDetach: a pod on the default networks — a skein pool on eth0,
// a plugin answering 1.1.0 on net1, one answering Kurma's old 0.2.0 shape
// on net2 — then a chatty plugin (logs on stderr) added to the running pod;
// records, results and interfaces checked; detach runs the dels in reverse
// and leaves nothing; a second detach is a no-op.
func TestAttachDetach(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	ctx := context.Background()
	before := harness.HostNet(t)

	res, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(res.Attached), []string{"pods@eth0", "good@net1", "oldstyle@net2"}; !equal(got, want) {
		t.Fatalf("attached %v, want %v", got, want)
	}
	wantAddr := map[string]string{"good": "10.1.0.5/24", "oldstyle": "10.2.0.5/24"}
	for _, a := range res.Attached {
		if a.State != kurma.StateAttached {
			t.Errorf("%s: state %q", a.Network, a.State)
		}
		var r current.Result
		if err := json.Unmarshal(a.Result, &r); err != nil {
			t.Fatalf("%s: result %s: %v", a.Network, a.Result, err)
		}
		if r.CNIVersion != "1.1.0" || len(r.IPs) == 0 || r.IPs[0].Interface == nil {
			t.Errorf("%s: result %s: want 1.1.0 with addresses on an interface", a.Network, a.Result)
			continue
		}
		ifc := r.Interfaces[*r.IPs[0].Interface]
		if ifc.Name != a.IfName || ifc.Sandbox != ns.Path() {
			t.Errorf("%s: result's interface %+v, want %s in %s", a.Network, ifc, a.IfName, ns.Path())
		}
		if want := wantAddr[a.Network]; want != "" && r.IPs[0].Address.String() != want {
			t.Errorf("%s: address %s, want %s", a.Network, r.IPs[0].Address.String(), want)
		}
		if a.Network == "pods" {
			if a.Digest != "" || a.Pool != "default" {
				t.Errorf("skein network recorded with digest %q pool %q", a.Digest, a.Pool)
			}
			if p := netip.MustParsePrefix("10.77.0.0/16"); !p.Contains(netip.MustParseAddr(r.IPs[0].Address.IP.String())) {
				t.Errorf("skein address %s not from the pool", r.IPs[0].Address.IP)
			}
		} else if !strings.HasPrefix(a.Digest, "sha256:") || a.Image != pluginImage {
			t.Errorf("%s: image %q digest %q", a.Network, a.Image, a.Digest)
		}
	}
	if got := links(t, ns); !equal(got, []string{"eth0", "net1", "net2"}) {
		t.Errorf("pod interfaces %v", got)
	}

	// A running pod gets one more network; its stderr is not its result.
	res2, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("chatty")})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res2.Attached); !equal(got, []string{"chatty@c146d7cef"}) {
		t.Errorf("chatty attached as %v", got)
	}
	st, err := w.pods.Status(ctx, uuid1)
	if err != nil || len(st.Attachments) != 4 || st.NetNS != ns.Path() {
		t.Fatalf("status %+v, %v", st, err)
	}

	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
	want := []string{"add good net1", "add oldstyle net2", "add chatty c146d7cef", "del chatty c146d7cef", "del oldstyle net2", "del good net1"}
	if got := w.calls(uuid1); !equal(got, want) {
		t.Errorf("plugin calls %q, want %q", got, want)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Errorf("second detach: %v", err)
	}
	if n := len(w.calls(uuid1)); n != len(want) {
		t.Errorf("second detach ran plugins: %d calls", n)
	}
	harness.AssertHostSame(t, before, "after attach and detach")
}

// TestAddFailures: the last network's add fails in each way a plugin can
// fail; the error says how, the earlier networks are removed in reverse
// order (their dels run), the failed one's del runs too (it may have done
// part of its work: every test add makes its link first), and nothing is
// left: no record, no interface, no address.
func TestAddFailures(t *testing.T) {
	w := newWorld(t, testNets)
	for _, c := range []struct {
		network, want string
	}{
		{"hang", "timed out"},
		{"crash", "exit status 2"},
		{"garbage", "not a JSON object"},
		{"fail", "CNI error 11: try again later"},
		{"noimage", "image"},
	} {
		t.Run(c.network, func(t *testing.T) {
			ns := w.pod()
			id := "pod-" + c.network
			start := time.Now()
			_, err := w.pods.Attach(context.Background(), kurma.AttachRequest{ID: id, NetNS: ns.Path(), Networks: sel("pods", "good", c.network)})
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to say %q", err, c.want)
			}
			t.Logf("error (after %v): %v", took.Round(time.Millisecond), err)
			w.assertNothingLeft(id, ns)
			want := []string{"add good net1", "add " + c.network + " net2", "del " + c.network + " net2", "del good net1"}
			if c.network == "noimage" {
				// Images are fetched before any add runs.
				want = nil
			}
			if got := w.calls(id); !equal(got, want) {
				t.Errorf("plugin calls %q, want %q", got, want)
			}
			// 3 s: the timeout also covers the sandbox's start before the
			// plugin logs its call, which a loaded machine can stretch.
			if c.network == "hang" && took > 15*time.Second {
				t.Errorf("a 3 s timeout took %v", took)
			}
		})
	}
}

// TestOptionalSkipped: an optional network's failure is reported, not
// fatal; its half-done work is deleted; the pod keeps the others.
func TestOptionalSkipped(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	res, err := w.pods.Attach(context.Background(), kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "maybe")})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res.Attached); !equal(got, []string{"good@net0"}) {
		t.Errorf("attached %v", got)
	}
	if len(res.Skipped) != 1 || res.Skipped[0].Network != "maybe" || !strings.Contains(res.Skipped[0].Error, "exit status 2") {
		t.Errorf("skipped %+v", res.Skipped)
	}
	if got := links(t, ns); !equal(got, []string{"net0"}) {
		t.Errorf("pod interfaces %v, want only net0", got)
	}
	st, err := w.pods.Status(context.Background(), uuid1)
	if err != nil || len(st.Attachments) != 1 {
		t.Errorf("record %+v, %v", st, err)
	}
	if err := w.pods.Detach(context.Background(), uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}

// TestBadInput: requests that cannot be served fail before anything runs
// with an error that says why, and change nothing.
func TestBadInput(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	busy := w.pod()
	rootPin := fmt.Sprintf("/kurma-test-%d", os.Getpid())
	if err := netns.Create(rootPin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(rootPin) })
	if _, err := busy.Exec(t, "ip", "link", "add", "net0", "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		req   kurma.AttachRequest
		want  string
		links []string
	}{
		{"unknown network", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "nosuch")}, `unknown network "nosuch"`, nil},
		{"same network twice", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "good")}, "asks for it twice", nil},
		{"duplicate ifname", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good@eth1", "oldstyle@eth1")}, `interface "eth1" already exists`, nil},
		{"ifname taken in the pod", kurma.AttachRequest{ID: uuid1, NetNS: busy.Path(), Networks: sel("good")}, `interface "net0"`, []string{"net0"}},
		{"bad ifname", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good@a/b")}, "contains '/'", nil},
		{"bad pod id", kurma.AttachRequest{ID: "../x", NetNS: ns.Path()}, "pod id", nil},
		{"proc netns", kurma.AttachRequest{ID: uuid1, NetNS: "/proc/1/ns/net"}, "pin the namespace", nil},
		{"missing netns", kurma.AttachRequest{ID: uuid1, NetNS: "/run/netns/kurma-missing"}, "netns", nil},
		{"netns pinned in /", kurma.AttachRequest{ID: uuid1, NetNS: rootPin, Networks: sel("good")}, "pinned in /", nil},
		{"the node's netns", kurma.AttachRequest{ID: uuid1, NetNS: w.node.Path(), Networks: sel("good")}, "node's network namespace", nil},
		{"bad image", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "noimage")}, "nonexistent", nil},
		// The front door's admission, called from the plan's own read of
		// the configuration, refuses before anything is made.
		{"not admitted", kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "oldstyle"), Admit: func(n kurma.Network) error {
			if n.Name == "oldstyle" {
				return fmt.Errorf("%w: network %q not for this pod", kurma.ErrBadRequest, n.Name)
			}
			return nil
		}}, `network "oldstyle" not for this pod`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := ns
			if c.links != nil {
				target = busy
			}
			_, err := w.pods.Attach(context.Background(), c.req)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to mention %q", err, c.want)
			}
			if c.name != "bad image" && !errors.Is(err, kurma.ErrBadRequest) {
				t.Errorf("err %v: want ErrBadRequest", err)
			}
			if _, serr := w.pods.Status(context.Background(), uuid1); !errors.Is(serr, kurma.ErrUnknownPod) {
				t.Errorf("a record was left: %v", serr)
			}
			if got := links(t, target); !equal(got, c.links) {
				t.Errorf("pod interfaces %v, want %v", got, c.links)
			}
			if got := w.calls(uuid1); len(got) > 0 {
				t.Errorf("plugins ran: %q", got)
			}
		})
	}
	atts, _ := w.d.Store().ListAttachments(context.Background())
	if len(atts) > 0 {
		t.Errorf("attachments left: %v", atts)
	}
}

// TestConcurrentPods: 20 pods attached at once (a skein pool and a plugin
// each), all served with distinct addresses; then detached at once.
func TestConcurrentPods(t *testing.T) {
	w := newWorld(t, testNets)
	const n = 20
	nss := make([]*harness.NS, n)
	for i := range nss {
		nss[i] = w.pod()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, n)
	addrs := make([]string, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: fmt.Sprintf("pod-%02d", i), NetNS: nss[i].Path(), Networks: sel("pods", "good")})
			errs[i] = err
			if err == nil {
				var r current.Result
				json.Unmarshal(res.Attached[0].Result, &r)
				if len(r.IPs) > 0 {
					addrs[i] = r.IPs[0].Address.IP.String()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d pods attached to 2 networks in %v", n, time.Since(start).Round(time.Millisecond))
	seen := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("pod %d: %v", i, err)
			continue
		}
		if addrs[i] == "" || seen[addrs[i]] {
			t.Errorf("pod %d: address %q (missing or given twice)", i, addrs[i])
		}
		seen[addrs[i]] = true
		if got := links(t, nss[i]); !equal(got, []string{"eth0", "net1"}) {
			t.Errorf("pod %d: interfaces %v", i, got)
		}
	}
	recs, err := w.pods.List(ctx)
	if err != nil || len(recs) != n {
		t.Errorf("%d records, %v", len(recs), err)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.pods.Detach(ctx, fmt.Sprintf("pod-%02d", i)); err != nil {
				t.Errorf("detach pod %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	for i := range n {
		w.assertNothingLeft(fmt.Sprintf("pod-%02d", i), nss[i])
	}
}

// TestDelFromRecord: the del runs from the record after the network left
// the config (reload) and after a restart of the daemon, with the config
// the add had; a reload with a bad config changes nothing.
func TestDelFromRecord(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	ctx := context.Background()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("pods", "good")}); err != nil {
		t.Fatal(err)
	}
	// A bad config is refused and the old networks stay.
	bad := w.cfg
	bad.PodNetworks = json.RawMessage(`[{"name":"x","image":"ftp://nope","type":"t"}]`)
	if err := w.d.ReloadPodNetworks(bad); err == nil {
		t.Fatal("reload with a bad image reference: want an error")
	}
	if _, ok := kurma.Find(w.pods.Networks(), "good"); !ok {
		t.Fatal("a refused reload dropped the old networks")
	}
	// Now "good" leaves the config, and the daemon restarts.
	w.cfg.PodNetworks = netsJSON(`[{"name":"pods","type":"skein","containerInterface":"eth0"}]`)
	if err := w.d.ReloadPodNetworks(w.cfg); err != nil {
		t.Fatal(err)
	}
	w.restart()
	if _, ok := kurma.Find(w.pods.Networks(), "good"); ok {
		t.Fatal("good still configured")
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
	if _, err := os.Stat(filepath.Join(w.state, "good", "del-"+uuid1+"-net1")); err != nil {
		t.Errorf("the del's marker: %v", err)
	}
	// The image is pruned once no record names it.
	if left, _ := filepath.Glob(filepath.Join(w.cfg.StateDir, "images", "sha256-*")); len(left) > 0 {
		t.Errorf("images kept with no record naming them: %v", left)
	}
}

// TestRecoverInterruptedAdd: a record left in state "adding" (skeind died
// during the add) is rolled back at start: its del runs, the entry goes.
func TestRecoverInterruptedAdd(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	ctx := context.Background()
	res, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "oldstyle")})
	if err != nil {
		t.Fatal(err)
	}
	// Make the record say the second add never finished.
	rec := res.Pod
	rec.Attachments[1].State = kurma.StateAdding
	rec.Attachments[1].Result = nil
	rec.Seal = "" // a durable record of its own, no completion over it
	b, _ := json.Marshal(rec)
	if err := w.d.Store().PutMeta(ctx, kurma.MetaKind, uuid1, b); err != nil {
		t.Fatal(err)
	}
	w.restart()
	st, err := w.pods.Status(ctx, uuid1)
	if err != nil || len(st.Attachments) != 1 || st.Attachments[0].Network != "good" {
		t.Fatalf("after recovery: %+v, %v", st, err)
	}
	if got := links(t, ns); !equal(got, []string{"net0"}) {
		t.Errorf("pod interfaces %v, want net0 only", got)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}

// failingMeta fails the pod records' writes while fail is set.
type failingMeta struct {
	store.Store
	fail atomic.Bool
}

var errDiskFull = errors.New("injected: no space left on device")

func (f *failingMeta) PutMeta(ctx context.Context, kind, key string, value []byte) error {
	if kind == kurma.MetaKind && f.fail.Load() {
		return errDiskFull
	}
	return f.Store.PutMeta(ctx, kind, key, value)
}

// TestIntentNotWritten: an image network's call is handed to its sandbox
// while the intent is written; when the intent cannot be written, the
// attach fails with that error, the plugin never runs and nothing is left
// (after a first attach the calls mostly find inits prepared for the
// network's layout; package sandbox's TestWait holds each way of starting
// back). Once the store works again, the same pod attaches.
func TestIntentNotWritten(t *testing.T) {
	w := newWorld(t, testNets)
	w.d.Close()
	bolt, err := store.OpenBolt(filepath.Join(w.dir, "failing.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := &failingMeta{Store: bolt}
	w.cfg.Store = st
	w.start()
	ctx := context.Background()
	ns := w.pod()
	// A first attach and detach: the network's layout is known to the
	// sandbox, so the next calls may find prepared inits.
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good")}); err != nil {
		t.Fatal(err)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	st.fail.Store(true)
	for i := range 3 {
		id := fmt.Sprintf("pod-intent-%d", i)
		_, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: id, NetNS: ns.Path(), Networks: sel("good", "oldstyle")})
		if !errors.Is(err, errDiskFull) {
			t.Fatalf("attach %d: err = %v, want the store's error", i, err)
		}
		// A late start would show in the plugin's log.
		time.Sleep(100 * time.Millisecond)
		if got := w.calls(id); len(got) > 0 {
			t.Errorf("attach %d: plugin calls %q without an intent on disk", i, got)
		}
		w.assertNothingLeft(id, ns)
	}
	st.fail.Store(false)
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good")}); err != nil {
		t.Fatalf("attach once the store works: %v", err)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}

// TestDetachNetNSGone: the pod's namespace is removed before its networks
// are (CNI: DEL must succeed then); detach runs every del anyway, with the
// namespace's path as the argument and nothing bound there, and leaves no
// record and no pool address.
func TestDetachNetNSGone(t *testing.T) {
	w := newWorld(t, testNets)
	ns := w.pod()
	ctx := context.Background()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("pods", "good")}); err != nil {
		t.Fatal(err)
	}
	if err := netns.Remove(ns.Path()); err != nil {
		t.Fatal(err)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatalf("detach with the netns gone: %v", err)
	}
	w.assertNothingLeft(uuid1, nil)
	if _, err := os.Stat(filepath.Join(w.state, "good", "del-"+uuid1+"-net1")); err != nil {
		t.Errorf("the del's marker: %v", err)
	}
}

// TestDetachOutlivesCaller: the caller gives up (its context is cancelled)
// while a del runs; the detach still finishes: the del is not killed, the
// record is removed, nothing is left for a retry.
func TestDetachOutlivesCaller(t *testing.T) {
	w := newWorld(t, `[{"name":"slowdel","image":"%IMG%","type":"test","mode":"ok","addr":"10.1.0.5/24","delMS":600,"containerInterface":"net0"}]`)
	ns := w.pod()
	if _, err := w.pods.Attach(context.Background(), kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("slowdel")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(150*time.Millisecond, cancel)
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatalf("detach whose caller gave up: %v", err)
	}
	w.assertNothingLeft(uuid1, ns)
	if _, err := os.Stat(filepath.Join(w.state, "slowdel", "del-"+uuid1+"-net0")); err != nil {
		t.Errorf("the del did not finish: %v", err)
	}
}

// TestRecordWritesPerPod: an attach commits the pod's record once to the
// synced file whatever the number of networks — the intent of them all
// before any add runs; the outcome goes to the volatile file — and a
// detach once (each synced commit is the most expensive part of a
// record).
func TestRecordWritesPerPod(t *testing.T) {
	w := newWorld(t, testNets)
	st, ok := w.d.Store().(interface{ Commits() uint64 })
	if !ok {
		t.Fatalf("the daemon's store %T does not count its commits", w.d.Store())
	}
	ctx := context.Background()
	ns := w.pod()
	before := st.Commits()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "oldstyle", "chatty")}); err != nil {
		t.Fatal(err)
	}
	if n := st.Commits() - before; n != 1 {
		t.Errorf("an attach of three image networks committed %d times to the synced file, want 1 (the intent)", n)
	}
	if got := volatileKeys(t, w); !equal(got, []string{uuid1}) {
		t.Errorf("completions %v, want the pod's", got)
	}
	if rec, err := w.pods.Status(ctx, uuid1); err != nil || len(rec.Attachments) != 3 || rec.Attachments[2].State != kurma.StateAttached {
		t.Errorf("after the attach: %+v, %v", rec, err)
	}
	before = st.Commits()
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	if n := st.Commits() - before; n != 1 {
		t.Errorf("a detach of three networks committed %d times, want 1", n)
	}
	w.assertNothingLeft(uuid1, ns)
}

// TestCompletionAcrossStarts: the outcome of an attach lives in the
// volatile file over the synced intent. A restart of skeind (the file
// kept) finds the pod attached and rolls nothing back (TestMetaRestart in
// test/kurma does the same with SIGKILL); the next durable write (another
// attach) carries the completed adds; a completion whose intent changed
// counts for nothing and is swept; a restart after a reboot (the file
// discarded) finds only the intent and rolls the add back.
func TestCompletionAcrossStarts(t *testing.T) {
	w := newWorld(t, testNets)
	ctx := context.Background()
	durable := func(key string) (kurma.PodRecord, bool) {
		t.Helper()
		b, err := w.d.Store().GetMeta(ctx, kurma.MetaKind, key)
		if errors.Is(err, store.ErrNotFound) {
			return kurma.PodRecord{}, false
		}
		var r kurma.PodRecord
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			t.Fatal(err)
		}
		return r, true
	}
	states := func(r kurma.PodRecord) (s []string) {
		for _, a := range r.Attachments {
			s = append(s, a.Network+":"+a.State)
		}
		return s
	}
	ns := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("good", "oldstyle")}); err != nil {
		t.Fatal(err)
	}
	if r, _ := durable(uuid1); !equal(states(r), []string{"good:adding", "oldstyle:adding"}) || r.Seal == "" {
		t.Fatalf("the synced file holds %v (seal %q), want the sealed intent", states(r), r.Seal)
	}
	if got := volatileKeys(t, w); !equal(got, []string{uuid1}) {
		t.Fatalf("completions %v, want the pod's", got)
	}

	// skeind restarts: the pod stays attached, nothing is rolled back.
	w.restart()
	st, err := w.pods.Status(ctx, uuid1)
	if err != nil || !equal(states(st), []string{"good:attached", "oldstyle:attached"}) {
		t.Fatalf("after a restart: %v, %v", states(st), err)
	}
	if got := links(t, ns); !equal(got, []string{"net0", "net1"}) {
		t.Fatalf("after a restart the pod has %v", got)
	}

	// Another network: the durable write carries the completed adds.
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("chatty")}); err != nil {
		t.Fatal(err)
	}
	if r, _ := durable(uuid1); !equal(states(r), []string{"good:attached", "oldstyle:attached", "chatty:adding"}) {
		t.Fatalf("the synced file holds %v after a second attach", states(r))
	}

	// plant stops skeind, writes c as a completion under keys, over a seal
	// no durable write had, and starts skeind again.
	plant := func(c kurma.PodRecord, keys ...string) {
		t.Helper()
		w.d.Close()
		vol := openVolatile(t, w)
		defer w.start()
		defer vol.Close()
		c.Over, c.Seal = "an-earlier-seal", ""
		b, _ := json.Marshal(c)
		for _, k := range keys {
			if err := vol.PutMeta(ctx, kurma.MetaKind, k, b); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A completion left over a changed intent (a crash between putRecord's
	// two writes) counts for nothing and is swept at start.
	stale, _ := durable(uuid1)
	stale.Attachments = stale.Attachments[:1]
	stale.Attachments[0].State = kurma.StateAttached
	plant(stale, uuid1, uuid1+"/gone")
	if got := volatileKeys(t, w); len(got) != 0 {
		t.Errorf("stale completions %v not swept", got)
	}
	if st, err := w.pods.Status(ctx, uuid1); err != nil || !equal(states(st), []string{"good:attached", "oldstyle:attached"}) {
		t.Fatalf("after a stale completion: %v, %v (want chatty rolled back, the rest kept)", states(st), err)
	}
	if got := links(t, ns); !equal(got, []string{"net0", "net1"}) {
		t.Fatalf("after rolling chatty back the pod has %v", got)
	}

	// A completion over a record with nothing to roll back, stale: it
	// claims a network the record does not have. Swept, not merged.
	stale, _ = durable(uuid1)
	stale.Attachments = append(stale.Attachments, stale.Attachments[0])
	stale.Attachments[2].Network = "chatty"
	plant(stale, uuid1)
	if got := volatileKeys(t, w); len(got) != 0 {
		t.Errorf("a stale completion over a settled record was not swept: %v", got)
	}
	if st, err := w.pods.Status(ctx, uuid1); err != nil || !equal(states(st), []string{"good:attached", "oldstyle:attached"}) {
		t.Fatalf("after a stale completion over a settled record: %v, %v", states(st), err)
	}

	// A reboot: this boot's file is discarded, the intent alone is left,
	// and Recover dels the adds it names.
	ns2 := w.pod()
	const uuid2 = "52c1f9a4-0d3e-4f55-9d47-5f7e0f3c7a21"
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid2, NetNS: ns2.Path(), Networks: sel("good")}); err != nil {
		t.Fatal(err)
	}
	w.d.Close()
	earlierBoot(t, w)
	w.start()
	if got := links(t, ns2); len(got) != 0 {
		t.Errorf("after a reboot the pod whose outcome was volatile kept %v", got)
	}
	w.assertNothingLeft(uuid2, ns2)
	if st, err := w.pods.Status(ctx, uuid1); err != nil || !equal(states(st), []string{"good:attached", "oldstyle:attached"}) {
		t.Fatalf("after a reboot the pod whose adds were durable: %v, %v", states(st), err)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}

// earlierBoot makes the stopped daemon's files say that its volatile
// file was made by an earlier boot (the two notes of store.Tiered).
func earlierBoot(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	durable, err := store.OpenBolt(filepath.Join(w.cfg.StateDir, "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer durable.Close()
	note, err := durable.GetMeta(ctx, "store", "volatile")
	if err != nil {
		t.Fatal(err)
	}
	var n map[string]string
	if err := json.Unmarshal(note, &n); err != nil || n["boot"] == "" {
		t.Fatalf("the volatile file's note %s: %v", note, err)
	}
	n["boot"] = "an-earlier-boot"
	note, _ = json.Marshal(n)
	vol := openVolatile(t, w)
	defer vol.Close()
	if err := errors.Join(durable.PutMeta(ctx, "store", "volatile", note), vol.PutMeta(ctx, "store", "boot", []byte(n["boot"]))); err != nil {
		t.Fatal(err)
	}
}

// openVolatile opens the stopped daemon's volatile file.
func openVolatile(t *testing.T, w *world) *store.Bolt {
	t.Helper()
	vol, err := store.OpenBolt(w.cfg.VolatileStorePath(), store.BoltOptions{AttachmentsOnly: true, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	return vol
}

// TestStartWithoutVolatileTier: skeind started once on a store without a
// volatile tier (as an older skeind, or a store of the caller's) rolls
// back the last attach, whose outcome it cannot see, and rewrites the
// record without a seal; started again with the tier, the completion it
// left there must not bring the rolled-back network back.
func TestStartWithoutVolatileTier(t *testing.T) {
	w := newWorld(t, testNets)
	ctx := context.Background()
	ns := w.pod()
	for _, n := range []string{"good", "oldstyle"} {
		if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel(n)}); err != nil {
			t.Fatal(err)
		}
	}
	w.d.Close()
	bolt, err := store.OpenBolt(filepath.Join(w.cfg.StateDir, "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.cfg.Store = bolt
	w.start()
	st, err := w.pods.Status(ctx, uuid1)
	if err != nil || len(st.Attachments) != 1 || st.Attachments[0].Network != "good" {
		t.Fatalf("without the volatile tier: %v, %v (want oldstyle rolled back)", names(st.Attachments), err)
	}
	if got := links(t, ns); !equal(got, []string{"net0"}) {
		t.Fatalf("without the volatile tier the pod has %v", got)
	}
	w.d.Close()
	w.cfg.Store = nil
	w.start()
	if st, err := w.pods.Status(ctx, uuid1); err != nil || len(st.Attachments) != 1 || st.Attachments[0].Network != "good" {
		t.Fatalf("with the tier again: %v, %v (the old completion counted)", names(st.Attachments), err)
	}
	if got := volatileKeys(t, w); len(got) != 0 {
		t.Errorf("the old completion was not swept: %v", got)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}
