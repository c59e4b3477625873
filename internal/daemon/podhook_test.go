package daemon

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/skeinnet/skein/api/rpc"
)

// fakeHook records the pod hook's calls; addErr fails Added.
type fakeHook struct {
	mu      sync.Mutex
	added   []PodRef
	deleted []PodRef
	addErr  error
	// linksAtDel is what the fake kernel had when Deleting ran (detach
	// must run inside it, not before).
	linksAtDel []string
	kernel     *fakeKernel
}

func (h *fakeHook) Added(_ context.Context, p PodRef) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.added = append(h.added, p)
	return h.addErr
}

func (h *fakeHook) Deleting(_ context.Context, p PodRef, detach func() error) error {
	h.mu.Lock()
	h.deleted = append(h.deleted, p)
	h.linksAtDel = h.kernel.linkNames()
	h.mu.Unlock()
	return detach()
}

// TestPodHook: the hook sees ADD and DEL of requests naming a Kubernetes
// pod (only those), after the interface exists and around the teardown;
// a failing hook fails the ADD, which then leaves nothing: no link, no
// record, no address held. In the pool mode and the meta mode alike.
func TestPodHook(t *testing.T) {
	pod := pinnedNS(t, "pod", "a pinned network namespace for CNI_NETNS")
	for _, mode := range []struct {
		name string
		conf string
		cfg  Config
	}{
		{"pool", `{"cniVersion":"1.1.0","name":"net","type":"skein","pool":"p"}`, Config{}},
		{"pod networks", `{"cniVersion":"1.1.0","name":"net","type":"skein","podNetworks":true}`,
			Config{PodNetworks: json.RawMessage(`[{"name":"pn","type":"skein","pool":"p","containerInterface":"eth0","default":true}]`)}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			h := &fakeHook{}
			mode.cfg.PodHook = h
			n := newTestNode(t, mode.cfg)
			h.kernel = n.kernel
			testPodHook(t, n, h, &cniServer{d: n.d}, []byte(mode.conf), pod)
		})
	}
}

func testPodHook(t *testing.T, n *testNode, h *fakeHook, srv *cniServer, conf []byte, pod string) {
	args := "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web"
	ctx := context.Background()

	// No pod named: no hook.
	if r, err := srv.Add(ctx, &rpc.CNIRequest{Netconf: conf, ContainerId: "c0", Ifname: "eth0", Netns: pod}); err != nil || r.Error != nil {
		t.Fatalf("ADD without K8S args: %v %v", err, r.GetError())
	}
	// (A DEL whose CNI_ARGS does not even parse still succeeds.)
	if r, err := srv.Del(ctx, &rpc.CNIRequest{Netconf: conf, ContainerId: "c0", Ifname: "eth0", Netns: pod, Args: "K8S_POD_NAME"}); err != nil || r.Error != nil {
		t.Fatalf("DEL with a bad CNI_ARGS: %v %v", err, r.GetError())
	}
	if len(h.added)+len(h.deleted) != 0 {
		t.Fatalf("hook called for a request naming no pod: %+v %+v", h.added, h.deleted)
	}

	// A failing hook: the ADD fails with its message, and nothing stays.
	h.addErr = errBoom
	r, err := srv.Add(ctx, &rpc.CNIRequest{Netconf: conf, ContainerId: "c1", Ifname: "eth0", Netns: pod, Args: args})
	if err != nil || r.Error == nil || !strings.Contains(r.Error.Msg, "boom") {
		t.Fatalf("ADD with a failing hook: %v %v, want an error saying boom", err, r.GetError())
	}
	want := PodRef{Namespace: "ns1", Name: "web", ContainerID: "c1", IfName: "eth0", NetNS: pod}
	if len(h.added) != 1 || h.added[0] != want {
		t.Fatalf("hook saw %+v, want %+v", h.added, want)
	}
	if n.used("p") != 0 || len(n.records()) != 0 || len(n.kernel.linkNames()) != 0 {
		t.Fatalf("a failed ADD left something: used %d, records %+v, links %v", n.used("p"), n.records(), n.kernel.linkNames())
	}
	if recs, err := n.d.pods.List(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("a failed ADD left pod records: %+v %v", recs, err)
	}

	// A succeeding hook: attached; DEL runs the teardown inside the hook.
	h.addErr = nil
	if r, err := srv.Add(ctx, &rpc.CNIRequest{Netconf: conf, ContainerId: "c1", Ifname: "eth0", Netns: pod, Args: args}); err != nil || r.Error != nil {
		t.Fatalf("ADD: %v %v", err, r.GetError())
	}
	if n.used("p") != 2 || len(n.kernel.linkNames()) != 1 {
		t.Fatalf("after ADD: used %d, links %v", n.used("p"), n.kernel.linkNames())
	}
	if r, err := srv.Del(ctx, &rpc.CNIRequest{Netconf: conf, ContainerId: "c1", Ifname: "eth0", Netns: pod, Args: args}); err != nil || r.Error != nil {
		t.Fatalf("DEL: %v %v", err, r.GetError())
	}
	if len(h.deleted) != 1 || h.deleted[0] != want || len(h.linksAtDel) != 1 {
		t.Fatalf("DEL hook: %+v (links when it ran %v), want %+v with the link still there", h.deleted, h.linksAtDel, want)
	}
	if n.used("p") != 0 || len(n.records()) != 0 || len(n.kernel.linkNames()) != 0 {
		t.Fatalf("after DEL: used %d, records %+v, links %v", n.used("p"), n.records(), n.kernel.linkNames())
	}
}
