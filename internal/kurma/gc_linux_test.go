package kurma_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
)

// TestGC: GC detaches the pods the caller does not keep, unless they were
// attached after its list was taken (since).
func TestGC(t *testing.T) {
	w := newWorld(t, testNets)
	ctx := context.Background()
	a, b := w.pod(), w.pod()
	for id, ns := range map[string]string{"pod-a": a.Path(), "pod-b": b.Path()} {
		if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: id, NetNS: ns, Networks: sel("pods", "good")}); err != nil {
			t.Fatal(err)
		}
	}
	keepA := func(id string) bool { return id == "pod-a" }
	gone, err := w.pods.GC(ctx, time.Now().Add(-time.Hour), keepA)
	if err != nil || len(gone) != 0 {
		t.Fatalf("GC of a list older than the pods removed %v, %v", gone, err)
	}
	gone, err = w.pods.GC(ctx, time.Now(), keepA)
	if err != nil || len(gone) != 1 || gone[0] != "pod-b" {
		t.Fatalf("GC removed %v, %v; want pod-b", gone, err)
	}
	w.assertNothingLeft("pod-b", b)
	if got := links(t, a); !equal(got, []string{"eth0", "net1"}) {
		t.Errorf("kept pod's interfaces %v", got)
	}
	if err := w.pods.Detach(ctx, "pod-a"); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft("pod-a", a)
}

// TestMainExec: an image's main exec runs while its network is configured
// (and stops when the network leaves the config); while a network's main
// exec is down, its adds fail at once saying so, and leave nothing.
func TestMainExec(t *testing.T) {
	w := newWorld(t, `[
  {"name":"served","image":"%MAINIMG%","type":"test","mode":"ok","addr":"10.4.0.5/24","containerInterface":"eth0"},
  {"name":"dying","image":"%MAINIMG%","type":"test","main":"die","mode":"ok","addr":"10.5.0.5/24","containerInterface":"eth1"}
]`)
	ctx := context.Background()
	ns := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("served")}); err != nil {
		t.Fatal(err)
	}
	waitMainExec(t, w, "served")
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		_, err = w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-dying", NetNS: ns.Path(), Networks: sel("dying")})
		if errors.Is(err, sandbox.ErrMainExecDown) {
			break
		}
		if err == nil {
			// Attached while the main exec was starting: undo, try again.
			if err := w.pods.Detach(ctx, "pod-dying"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !errors.Is(err, sandbox.ErrMainExecDown) || !strings.Contains(err.Error(), "main exec") {
		t.Fatalf("attach while the main exec is down: %v", err)
	}
	t.Logf("add while down: %v", err)
	if _, serr := w.pods.Status(ctx, "pod-dying"); !errors.Is(serr, kurma.ErrUnknownPod) {
		t.Errorf("record left: %v", serr)
	}
	if n := mainExecs(t); n < 1 {
		t.Errorf("%d main execs running, want served's at least (dying's is down most of the time)", n)
	}
	// The networks leave the config: their main execs stop; the pod's
	// del still runs from its record.
	w.pods.SetNetworks(nil)
	if n := mainExecs(t); n != 0 {
		t.Errorf("%d main execs still running after their networks left the config", n)
	}
	if err := w.pods.Detach(ctx, uuid1); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft(uuid1, ns)
}

// mainExecs counts this process's children running /opt/network/main.
func mainExecs(t *testing.T) int {
	t.Helper()
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if strings.HasPrefix(string(cmd), "/opt/network/main\x00") {
			n++
		}
	}
	return n
}

// TestReloadStopsMainExecPromptly: a network whose main exec has no SIGTERM
// handler (as PID 1 it would never see one) leaves the config while another
// pod attaches: the main exec is killed at once, and neither the reload nor
// the attach waits for a stop grace.
func TestReloadStopsMainExecPromptly(t *testing.T) {
	const nets = `[
  {"name":"good","image":"%IMG%","type":"test","mode":"ok","addr":"10.1.0.5/24","containerInterface":"eth0"},
  {"name":"stubborn","image":"%MAINIMG%","type":"test","main":"ignore-term","mode":"ok","addr":"10.4.0.5/24","containerInterface":"eth1"}
]`
	w := newWorld(t, nets)
	ctx := context.Background()
	ns := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("stubborn")}); err != nil {
		t.Fatal(err)
	}
	// Let the main exec get as far as ignoring SIGTERM.
	waitMainExec(t, w, "stubborn")
	time.Sleep(100 * time.Millisecond)

	w.cfg.PodNetworks = netsJSON(`[{"name":"good","image":"%IMG%","type":"test","mode":"ok","addr":"10.1.0.5/24","containerInterface":"eth0"}]`)
	reloaded := make(chan time.Duration, 1)
	begin := time.Now()
	go func() {
		if err := w.d.ReloadPodNetworks(w.cfg); err != nil {
			t.Error(err)
		}
		reloaded <- time.Since(begin)
	}()
	time.Sleep(20 * time.Millisecond)
	other := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-other", NetNS: other.Path(), Networks: sel("good")}); err != nil {
		t.Fatal(err)
	}
	// Both well under the main exec's 5 s stop grace, which neither may
	// wait out; the slack is for a loaded machine.
	if took := time.Since(begin); took > 4*time.Second {
		t.Errorf("an attach during the reload took %s", took)
	}
	if took := <-reloaded; took > 4*time.Second {
		t.Errorf("the reload took %s (waited out the stop grace)", took)
	}
	if n := mainExecs(t); n != 0 {
		t.Errorf("%d main execs still running after their network left the config", n)
	}
	for _, id := range []string{uuid1, "pod-other"} {
		if err := w.pods.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	w.assertNothingLeft(uuid1, ns)
	w.assertNothingLeft("pod-other", other)
}

// TestGCReattached: a pod detached and attached again between GC's list
// and its detach is not garbage any more (its record is newer than since):
// GC leaves it. keep, called between the two, is the hook that does it.
func TestGCReattached(t *testing.T) {
	w := newWorld(t, testNets)
	ctx := context.Background()
	ns := w.pod()
	attach := func() {
		t.Helper()
		if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-a", NetNS: ns.Path(), Networks: sel("pods", "good")}); err != nil {
			t.Fatal(err)
		}
	}
	attach()
	since := time.Now()
	time.Sleep(10 * time.Millisecond)
	again := func(id string) bool {
		if err := w.pods.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
		attach()
		return false
	}
	gone, err := w.pods.GC(ctx, since, again)
	if err != nil || len(gone) != 0 {
		t.Fatalf("GC removed %v, %v; want nothing (the pod was attached again)", gone, err)
	}
	st, err := w.pods.Status(ctx, "pod-a")
	if err != nil || len(st.Attachments) != 2 {
		t.Fatalf("the re-attached pod: %+v, %v", st, err)
	}
	if got := links(t, ns); !equal(got, []string{"eth0", "net1"}) {
		t.Errorf("re-attached pod's interfaces %v", got)
	}
	if err := w.pods.Detach(ctx, "pod-a"); err != nil {
		t.Fatal(err)
	}
	w.assertNothingLeft("pod-a", ns)
}

// waitMainExec waits until the main exec of network has logged its start
// (it may take a moment), at most 10 s.
func waitMainExec(t *testing.T, w *world, network string) {
	t.Helper()
	log := filepath.Join(w.state, network, "log")
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "main "+network) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the main exec of %s did not start within 10 s:\n%s", network, b)
		}
	}
}
