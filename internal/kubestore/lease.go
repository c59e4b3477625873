package kubestore

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// leaseKeeper renews the node's liveness Lease. skein-controller takes a
// deleted Node's blocks back only once this Lease has expired, so that a
// node that still runs (its Node deleted by `kubectl delete node`, or by a
// cloud controller while it was NotReady) never loses its blocks to
// another node.
type leaseKeeper struct {
	s         *Store
	namespace string
	duration  time.Duration
	wg        sync.WaitGroup
	warned    bool
	// last is the Lease as last written: a renewal is one update of it
	// (no read first) unless someone else changed it meanwhile.
	last *coordinationv1.Lease
	// okSent is when the last renewal that succeeded was sent (zero:
	// none yet): the Lease runs until at most okSent + duration, by this
	// node's clock, since its renewTime is no later.
	mu     sync.Mutex
	okSent time.Time
	// lastErr is the last renewal's failure (nil once one succeeds), for
	// fenced's message: a Lease that cannot be written at all (RBAC, no
	// namespace) must say why.
	lastErr error
}

func newLeaseKeeper(s *Store, namespace string, duration time.Duration) *leaseKeeper {
	if namespace == "" {
		namespace = DefaultLeaseNamespace
	}
	if duration == 0 {
		duration = DefaultLeaseDuration
	}
	return &leaseKeeper{s: s, namespace: namespace, duration: duration}
}

// run renews the Lease every quarter of its duration until done closes.
func (l *leaseKeeper) run(done <-chan struct{}) {
	l.wg.Add(1)
	defer l.wg.Done()
	t := time.NewTicker(l.duration / 4)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.duration/4)
		l.renew(ctx)
		cancel()
	}
}

func (l *leaseKeeper) wait() { l.wg.Wait() }

// renew creates the Lease or moves its renewTime to now. A failure is
// logged (once until it works again) and retried at the next tick: the
// Lease has three more chances before it expires.
func (l *leaseKeeper) renew(ctx context.Context) {
	sent := time.Now()
	l.mu.Lock()
	prev := l.okSent
	l.mu.Unlock()
	err := l.renewOnce(ctx)
	// Fenced at any moment since the last renewal (this one may have
	// been sent just before the fence and answered after it): the cache
	// may have missed the blocks taken from this node (a watch cut off
	// with the rest), so what it owns is read from the API server itself
	// before it acts again.
	if err == nil && (prev.IsZero() || l.age(prev) > l.fenceAfter()) {
		err = l.s.verifyOwned(ctx)
	}
	l.mu.Lock()
	if err == nil {
		l.okSent = sent
	}
	l.lastErr = err
	l.mu.Unlock()
	switch {
	case err != nil && !l.warned:
		slog.Warn("cannot renew this node's liveness Lease (skein-controller may take the blocks of a deleted Node once it expires)",
			"lease", l.namespace+"/"+skeinv1.NodeLeaseName(l.s.node), "err", err)
		l.warned = true
	case err == nil && l.warned:
		slog.Info("node liveness Lease renewed again", "lease", l.namespace+"/"+skeinv1.NodeLeaseName(l.s.node))
		l.warned = false
	}
	if err != nil {
		l.s.m.leaseErrors.Inc()
	}
}

// fenced is nil while the Lease this node last renewed still runs, and
// otherwise says since when it may have expired: from then on
// skein-controller may give the blocks of a deleted Node to other nodes,
// so the node must neither hand out their addresses nor route them.
func (l *leaseKeeper) fenced() error {
	l.mu.Lock()
	sent, last := l.okSent, l.lastErr
	l.mu.Unlock()
	lease := l.namespace + "/" + skeinv1.NodeLeaseName(l.s.node)
	why := ""
	if last != nil {
		why = " (last attempt: " + last.Error() + ")"
	}
	if sent.IsZero() {
		return fmt.Errorf("this node's liveness Lease %s has not been renewed since skeind started%s", lease, why)
	}
	if age := l.age(sent); age > l.fenceAfter() {
		return fmt.Errorf("this node's liveness Lease %s was last renewed %s ago, longer than its %s: the API server is out of reach or refuses this node, and skein-controller may give its blocks to other nodes%s",
			lease, age.Round(time.Second), l.fenceAfter(), why)
	}
	return nil
}

// age is how long ago t was: the longer of the monotonic clock's reading,
// which stops while the machine is suspended, and the wall clock's, which
// does not (a node suspended past its Lease must not act as if it had
// just renewed).
func (l *leaseKeeper) age(t time.Time) time.Duration {
	return max(time.Since(t), time.Now().Round(0).Sub(t.Round(0)))
}

// fenceAfter is the Lease's duration as written (whole seconds, as
// skein-controller reads it).
func (l *leaseKeeper) fenceAfter() time.Duration {
	return time.Duration(int32(l.duration/time.Second)) * time.Second
}

func (l *leaseKeeper) renewOnce(ctx context.Context) error {
	now := metav1.NewMicroTime(time.Now())
	name := skeinv1.NodeLeaseName(l.s.node)
	if l.last != nil {
		lease := l.last.DeepCopy()
		lease.Spec.RenewTime = &now
		err := l.s.client.Update(ctx, lease)
		if err == nil {
			l.last = lease
			return nil
		}
		l.last = nil // changed or gone: read it again below
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("renew Lease %s/%s: %w", l.namespace, name, err)
		}
	}
	lease := &coordinationv1.Lease{}
	err := l.s.client.Get(ctx, client.ObjectKey{Namespace: l.namespace, Name: name}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: l.namespace, Name: name,
				Labels: map[string]string{skeinv1.LabelNode: l.s.node}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(l.s.node),
				LeaseDurationSeconds: ptr.To(int32(l.duration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		if err := l.s.client.Create(ctx, lease); err != nil {
			return fmt.Errorf("create Lease %s/%s: %w", l.namespace, name, err)
		}
		l.last = lease
		return nil
	}
	if err != nil {
		return fmt.Errorf("get Lease %s/%s: %w", l.namespace, name, err)
	}
	lease.Spec.HolderIdentity = ptr.To(l.s.node)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(l.duration / time.Second))
	lease.Spec.RenewTime = &now
	if err := l.s.client.Update(ctx, lease); err != nil {
		return fmt.Errorf("renew Lease %s/%s: %w", l.namespace, name, err)
	}
	l.last = lease
	return nil
}

// nodeOwner returns a reference to this node's Node object, looked up once
// it exists (a read; nil where nodes are not Node objects, as in tests).
func (s *Store) nodeOwner(ctx context.Context) *metav1.OwnerReference {
	s.ownerMu.Lock()
	defer s.ownerMu.Unlock()
	if s.owner != nil {
		return s.owner
	}
	n := &corev1.Node{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: s.node}, n); err != nil {
		return nil
	}
	s.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, BlockOwnerDeletion: ptr.To(false)}
	return s.owner
}

// event posts a Warning event on this node's Node object, best effort.
func (s *Store) event(reason, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ref := s.nodeOwner(ctx)
	if ref == nil {
		return
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: s.node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: ref.Name, UID: ref.UID, APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "skeind", Host: s.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := s.client.Create(ctx, ev); err != nil {
		slog.Warn("post event on the Node", "reason", reason, "err", err)
	}
}

// Fenced is nil while this node's liveness Lease, as last renewed, still
// runs (or the Store keeps none), and otherwise says why the node must not
// act on its blocks: skein-controller may be giving them to other nodes
// (ipam.Fencer). It answers from memory.
func (s *Store) Fenced() error {
	if s.lease == nil {
		return nil
	}
	return s.lease.fenced()
}

// verifyOwned drops from the owned set every block the API server (a
// live list, not the cache) no longer shows as this node's, with the same
// UID and not being deleted, and tells the Manager about their pools.
// The list speaks for the blocks owned before it was asked for; one that
// became owned while it was under way (a claim's answer, a live read) may
// be newer than the list or not, so it is read again by name.
func (s *Store) verifyOwned(ctx context.Context) error {
	s.ownMu.RLock()
	before := maps.Clone(s.owned)
	s.ownMu.RUnlock()
	var live skeinv1.AddressBlockList
	if err := s.client.List(ctx, &live, client.MatchingLabels{skeinv1.LabelNode: s.node}); err != nil {
		return fmt.Errorf("list this node's AddressBlocks: %w", err)
	}
	still := map[string]types.UID{}
	for i := range live.Items {
		b := &live.Items[i]
		if ownerOf(b) == s.node && b.DeletionTimestamp.IsZero() {
			still[b.Name] = b.UID
		}
	}
	var gone []string
	var since map[string]types.UID
	s.ownMu.Lock()
	for name, uid := range before {
		if still[name] == uid {
			continue
		}
		// That life of the block is over for this node, whether the
		// owned set still holds it or a give-back forgot it meanwhile.
		s.retireLocked(uid)
		if s.owned[name] == uid {
			delete(s.owned, name)
			gone = append(gone, name)
		}
	}
	for name, uid := range s.owned {
		if before[name] != uid && still[name] != uid {
			if since == nil {
				since = map[string]types.UID{}
			}
			since[name] = uid
		}
	}
	s.ownMu.Unlock()
	var rerr error
	for name, uid := range since {
		b := &skeinv1.AddressBlock{}
		err := s.client.Get(ctx, client.ObjectKey{Name: name}, b)
		switch {
		case err == nil && b.UID == uid && ownerOf(b) == s.node && b.DeletionTimestamp.IsZero():
			continue // this node's
		case err != nil && !apierrors.IsNotFound(err):
			// Not known yet: the renewal fails, and the next one reads
			// again.
			rerr = fmt.Errorf("read AddressBlock %s: %w", name, err)
			continue
		}
		s.ownMu.Lock()
		s.retireLocked(uid)
		if s.owned[name] == uid {
			delete(s.owned, name)
			gone = append(gone, name)
		}
		s.ownMu.Unlock()
	}
	for _, name := range gone {
		slog.Warn("a block of this node was taken while it could not renew its Lease", "block", name)
		// BlockName is pool-index; the Manager looks the pool over.
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			s.notify(name[:i])
		}
	}
	return rerr
}
