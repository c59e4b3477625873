package router

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func pod(uid string, ann map[string]string, phase corev1.PodPhase, hostNet bool, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "apps", UID: types.UID(uid), Annotations: ann},
		Spec:       corev1.PodSpec{HostNetwork: hostNet},
		Status:     corev1.PodStatus{Phase: phase},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestClientAddrs(t *testing.T) {
	const key = "egress.skein.dev/gw"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want []netip.Addr
	}{
		{"listed alone", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, false, "10.0.0.1"), addrs("10.0.0.1")},
		{"listed among others, spaces", pod("a", map[string]string{key: " web ,nat , db"}, corev1.PodRunning, false, "10.0.0.1"), addrs("10.0.0.1")},
		{"dual stack, sorted", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, false, "fd00::1", "10.0.0.1"), addrs("10.0.0.1", "fd00::1")},
		{"pending with addresses", pod("a", map[string]string{key: "nat"}, corev1.PodPending, false, "10.0.0.1"), addrs("10.0.0.1")},
		{"phase unknown", pod("a", map[string]string{key: "nat"}, corev1.PodUnknown, false, "10.0.0.1"), addrs("10.0.0.1")},
		{"mapped v4 unmapped", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, false, "::ffff:10.0.0.1"), addrs("10.0.0.1")},
		{"bad address skipped", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, false, "nope", "10.0.0.1"), addrs("10.0.0.1")},
		{"duplicates folded", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, false, "10.0.0.1", "10.0.0.1"), addrs("10.0.0.1")},
		{"other egress", pod("a", map[string]string{key: "web"}, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"a name's prefix", pod("a", map[string]string{key: "nat2,na"}, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"wrong namespace key", pod("a", map[string]string{"egress.skein.dev/apps": "nat"}, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"key without the prefix", pod("a", map[string]string{"gw": "nat"}, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"empty value", pod("a", map[string]string{key: ""}, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"no annotation", pod("a", nil, corev1.PodRunning, false, "10.0.0.1"), nil},
		{"host network", pod("a", map[string]string{key: "nat"}, corev1.PodRunning, true, "192.168.1.5"), nil},
		{"succeeded", pod("a", map[string]string{key: "nat"}, corev1.PodSucceeded, false, "10.0.0.1"), nil},
		{"failed", pod("a", map[string]string{key: "nat"}, corev1.PodFailed, false, "10.0.0.1"), nil},
		{"no addresses", pod("a", map[string]string{key: "nat"}, corev1.PodPending, false), nil},
	} {
		if got := ClientAddrs(tc.pod, "gw", "nat"); !slices.Equal(got, tc.want) {
			t.Errorf("%s: ClientAddrs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStripKeepsWhatClientAddrsReads(t *testing.T) {
	p := pod("a", map[string]string{"egress.skein.dev/gw": "nat", "egress.skein.dev/other": "x", "big": "y"},
		corev1.PodRunning, false, "10.0.0.1", "fd00::1")
	p.Labels = map[string]string{"app": "web"}
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "i"}}
	s := Strip(p, "gw")
	if !slices.Equal(ClientAddrs(s, "gw", "nat"), ClientAddrs(p, "gw", "nat")) {
		t.Errorf("stripped pod's addresses %v, the pod's %v", ClientAddrs(s, "gw", "nat"), ClientAddrs(p, "gw", "nat"))
	}
	if len(s.Annotations) != 1 || s.Labels != nil || s.Spec.Containers != nil || s.UID != p.UID || s.Name != p.Name || s.Namespace != p.Namespace {
		t.Errorf("stripped pod keeps too much or too little: %+v", s)
	}
	h := pod("h", map[string]string{"egress.skein.dev/gw": "nat"}, corev1.PodFailed, true, "10.0.0.1")
	if s := Strip(h, "gw"); !s.Spec.HostNetwork || s.Status.Phase != corev1.PodFailed {
		t.Errorf("stripped pod lost hostNetwork or phase: %+v", s)
	}
}

func TestPeerSet(t *testing.T) {
	s := newPeerSet("gw", "nat")
	use := map[string]string{"egress.skein.dev/gw": "nat"}
	steps := []struct {
		name    string
		do      func() bool
		changed bool
		want    []netip.Addr
		pods    int
	}{
		{"a client", func() bool { return s.update(pod("a", use, corev1.PodRunning, false, "10.0.0.1")) }, true, addrs("10.0.0.1"), 1},
		{"same again", func() bool { return s.update(pod("a", use, corev1.PodRunning, false, "10.0.0.1")) }, false, addrs("10.0.0.1"), 1},
		{"not a client", func() bool { return s.update(pod("b", nil, corev1.PodRunning, false, "10.0.0.2")) }, false, addrs("10.0.0.1"), 1},
		{"another, dual stack", func() bool { return s.update(pod("c", use, corev1.PodRunning, false, "fd00::3", "10.0.0.3")) }, true, addrs("10.0.0.1", "10.0.0.3", "fd00::3"), 2},
		{"an address reused by a new pod", func() bool { return s.update(pod("d", use, corev1.PodRunning, false, "10.0.0.1")) }, true, addrs("10.0.0.1", "10.0.0.3", "fd00::3"), 3},
		{"the old one finishes", func() bool { return s.update(pod("a", use, corev1.PodSucceeded, false, "10.0.0.1")) }, true, addrs("10.0.0.1", "10.0.0.3", "fd00::3"), 2},
		{"annotation dropped", func() bool { return s.update(pod("c", nil, corev1.PodRunning, false, "fd00::3", "10.0.0.3")) }, true, addrs("10.0.0.1"), 1},
		{"delete unknown", func() bool { return s.remove("apps/zz") }, false, addrs("10.0.0.1"), 1},
		{"delete", func() bool { return s.remove("apps/d") }, true, nil, 0},
	}
	for _, st := range steps {
		if got := st.do(); got != st.changed {
			t.Errorf("%s: changed = %v, want %v", st.name, got, st.changed)
		}
		got, pods := s.snapshot(all)
		if !slices.Equal(got, st.want) || pods != st.pods {
			t.Errorf("%s: snapshot %v of %d pods, want %v of %d", st.name, got, pods, st.want, st.pods)
		}
	}
}

// A pod deleted and made again under its name (a StatefulSet's) while the
// watch was down: the informer's relist replaces the old object by the
// new one under the same key and calls the update handler, never the
// delete handler, so the old pod's addresses must go with that update.
func TestPeerSetPodReplacedOnRelist(t *testing.T) {
	s := newPeerSet("gw", "nat")
	use := map[string]string{"egress.skein.dev/gw": "nat"}
	old := pod("web-0", use, corev1.PodRunning, false, "10.0.0.1")
	s.update(old)
	recreated := pod("web-0", use, corev1.PodRunning, false, "10.0.0.9")
	recreated.UID = "web-0-again"
	if !s.update(recreated) {
		t.Error("the recreated pod's new address was not a change")
	}
	if got, pods := s.snapshot(all); !slices.Equal(got, addrs("10.0.0.9")) || pods != 1 {
		t.Errorf("snapshot %v of %d pods, want only the new pod's 10.0.0.9 of 1", got, pods)
	}
	// Its later deletion (by the informer's key) leaves nothing.
	if !s.remove(podKey(recreated)) {
		t.Error("deleting the recreated pod was not a change")
	}
	if got, pods := s.snapshot(all); len(got) != 0 || pods != 0 {
		t.Errorf("after the delete: snapshot %v of %d pods, want none", got, pods)
	}
}
func all(string) bool { return true }
