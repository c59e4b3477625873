package kurma

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// kubeletPod is annotated's runtime config with the CNI_ARGS a kubelet
// sends, naming the pod's namespace.
func kubeletPod(id, netnsPath, namespace, networks string) *libcni.RuntimeConf {
	rt := annotated(id, netnsPath, networks)
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}, {"K8S_POD_INFRA_CONTAINER_ID", id}}
	return rt
}

// TestMetaAllowList: a pod's skein.dev/networks annotation is its owner's
// to write, so it cannot choose a network its namespace may not use. A
// network listing allowedNamespaces admits those namespaces' pods only; a
// non-default network listing nobody admits no Kubernetes pod; the
// namespaceSelector needs the Kubernetes store. A refused ADD says which
// network and namespace (code 103) and leaves nothing: no interface, no
// record, no address held. Requests without K8S_POD_NAMESPACE (a runtime
// on the host) are not a tenant's and are not checked.
func TestMetaAllowList(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	blue := bridgeNet("blue", "file://"+img.path, "", "kbr-b", "10.78.0.0/24")
	blue["allowedNamespaces"] = []string{"team-blue"}
	blue["containerInterface"] = "net1"
	green := bridgeNet("green", "file://"+img.path, "", "kbr-g", "10.79.0.0/24")
	green["containerInterface"] = "net2"
	red := bridgeNet("red", "file://"+img.path, "", "kbr-r", "10.80.0.0/24")
	red["namespaceSelector"] = map[string]any{"matchLabels": map[string]string{"team": "red"}}
	red["containerInterface"] = "net3"
	d := startSkeind(t, node, []map[string]any{poolNet("pool", true), blue, green, red})
	c := d.CNI()
	list := metaList(t, d)

	refused := []struct{ ns, networks, want, net string }{
		{"team-red", "pool, blue@net1", `pod network "blue" may not be used by pods of namespace "team-red"`, "blue"},
		{"team-blue", "pool, green@net2", `pod network "green" may not be used by pods of namespace "team-blue": the network is not a default network`, "green"},
		// The second network is refused after nothing was made for the first.
		{"team-blue", "pool, blue@net1, green@net2", `pod network "green"`, "green"},
		{"team-blue", "pool, red@net3", "only skeind --store kubernetes reads", "red"},
	}
	for i, r := range refused {
		pod := harness.NewNS(t, "pod")
		before := harness.Snapshot(t, node)
		rt := kubeletPod("refused-"+string(rune('a'+i)), pod.Path(), r.ns, r.networks)
		_, err := c.AddNetworkList(ctx(t), list, rt)
		if err == nil || skeintest.ErrCode(err) != cni.CodeNetworkNotAllowed || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s asking for %q: %v (code %d), want code %d and %q", r.ns, r.networks, err, skeintest.ErrCode(err), cni.CodeNetworkNotAllowed, r.want)
		}
		if links, _ := pod.Handle(t).LinkList(); len(links) != 1 {
			t.Errorf("%s asking for %q: the pod has %d links, want lo only", r.ns, r.networks, len(links))
		}
		if atts := d.Attachments(t); len(atts) != 0 {
			t.Errorf("%s asking for %q: records left: %v", r.ns, r.networks, atts)
		}
		harness.AssertSame(t, before, harness.Snapshot(t, node))
		// The runtime's DEL after the failed ADD (containerd always
		// sends one) finds no record; it must not run the refused
		// network's plugin either (nor unpack its image, nor start its
		// main exec).
		if err := c.DelNetworkList(ctx(t), list, rt); err != nil {
			t.Errorf("%s asking for %q: the DEL after the refusal: %v", r.ns, r.networks, err)
		}
		if _, err := os.Stat(filepath.Join(d.Dir, "state", "pod-networks", r.net)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s asking for %q: the DEL after the refusal ran network %q (its state directory: %v)", r.ns, r.networks, r.net, err)
		}
		harness.AssertSame(t, before, harness.Snapshot(t, node))
	}

	// A tenant's "[]" crashed skeind, on the ADD and on every retry and
	// DEL: now a clear refusal, and skeind serves the next pod.
	empty := kubeletPod("empty-list", harness.NewNS(t, "pod").Path(), "team-blue", "[]")
	if _, err := c.AddNetworkList(ctx(t), list, empty); skeintest.ErrCode(err) != 7 || !strings.Contains(err.Error(), "empty list") {
		t.Errorf(`ADD with "[]": %v, want code 7 naming the empty list`, err)
	}
	if err := c.DelNetworkList(ctx(t), list, empty); err != nil {
		t.Errorf(`DEL with "[]": %v`, err)
	}

	// Admitted: blue from its namespace; the defaults from any namespace;
	// any network from a runtime on the host (no K8S_POD_NAMESPACE).
	admitted := []*libcni.RuntimeConf{
		kubeletPod("ok-blue", harness.NewNS(t, "pod").Path(), "team-blue", "pool, blue@net1"),
		kubeletPod("ok-default", harness.NewNS(t, "pod").Path(), "team-red", ""),
		annotated("ok-host", harness.NewNS(t, "pod").Path(), "pool, green@net2"),
	}
	for _, rt := range admitted {
		if _, err := c.AddNetworkList(ctx(t), list, rt); err != nil {
			t.Errorf("%s: %v", rt.ContainerID, err)
		}
	}
	for _, rt := range admitted {
		if err := c.DelNetworkList(ctx(t), list, rt); err != nil {
			t.Errorf("DEL %s: %v", rt.ContainerID, err)
		}
	}
	if atts := d.Attachments(t); len(atts) != 0 {
		t.Errorf("records left after the DELs: %v", atts)
	}
}
