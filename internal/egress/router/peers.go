package router

import (
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// Uses reports whether pod's annotations name Egress namespace/name
// (skeinv1.WantedEgresses, the parser skeind's client side uses too).
func Uses(pod *corev1.Pod, namespace, name string) bool {
	return slices.Contains(skeinv1.WantedEgresses(pod.Annotations), types.NamespacedName{Namespace: namespace, Name: name})
}

// ClientAddrs returns the addresses to tunnel to for pod, sorted, or nil
// when pod is not a client of Egress namespace/name: it does not use it,
// runs on the host's network (its addresses are the node's), has
// finished (its addresses may already be someone else's), or has no
// addresses yet. Unparsable entries of status.podIPs are skipped.
func ClientAddrs(pod *corev1.Pod, namespace, name string) []netip.Addr {
	if !Uses(pod, namespace, name) || pod.Spec.HostNetwork {
		return nil
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var out []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil || !a.IsValid() {
			continue
		}
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Strip returns the part of pod ClientAddrs reads (and its identity), for
// the informer's transform: a router watches every pod of the namespaces
// its Egress serves, and keeps only this of each.
func Strip(pod *corev1.Pod, namespace string) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Spec:   corev1.PodSpec{HostNetwork: pod.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIPs: pod.Status.PodIPs},
	}
	key := skeinv1.AnnotationEgressPrefix + namespace
	if v, ok := pod.Annotations[key]; ok {
		out.Annotations = map[string]string{key: v}
	}
	return out
}

// peerSet is the client addresses of each pod, kept from informer events.
//
// Pods are keyed by namespace/name, as the informer keys them, not by
// UID: a pod deleted and made again under its name while the watch was
// down (a StatefulSet's) comes back from the relist as an update of the
// old object, with no delete, so a set keyed by UID would keep the old
// pod's addresses for good.
type peerSet struct {
	namespace, name string

	mu    sync.Mutex
	byPod map[string][]netip.Addr
}

func newPeerSet(namespace, name string) *peerSet {
	return &peerSet{namespace: namespace, name: name, byPod: map[string][]netip.Addr{}}
}

// podKey is pod's key in a peerSet (and in the informer's store).
func podKey(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// update records pod's addresses and reports whether they changed.
func (s *peerSet) update(pod *corev1.Pod) bool {
	addrs := ClientAddrs(pod, s.namespace, s.name)
	s.mu.Lock()
	defer s.mu.Unlock()
	key := podKey(pod)
	old, had := s.byPod[key]
	if len(addrs) == 0 {
		delete(s.byPod, key)
		return had
	}
	s.byPod[key] = addrs
	return !had || !slices.Equal(old, addrs)
}

// remove forgets the pod of key (podKey) and reports whether it had
// addresses.
func (s *peerSet) remove(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, had := s.byPod[key]
	delete(s.byPod, key)
	return had
}

// forget drops the pods of the namespaces keep does not admit (their
// informer stopped).
func (s *peerSet) forget(keep func(namespace string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.byPod {
		if ns, _, _ := strings.Cut(key, "/"); !keep(ns) {
			delete(s.byPod, key)
		}
	}
}

// snapshot returns the client addresses of pods whose namespace serves
// admits, sorted and without duplicates (two pods may briefly hold one
// address while one is torn down), and the number of those pods.
func (s *peerSet) snapshot(serves func(namespace string) bool) (addrs []netip.Addr, pods int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, a := range s.byPod {
		ns, _, _ := strings.Cut(key, "/")
		if !serves(ns) {
			continue
		}
		addrs = append(addrs, a...)
		pods++
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), pods
}
