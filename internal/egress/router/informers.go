package router

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// A router's account may read the pods of the namespaces its Egress
// serves and no others (internal/egresscontroller grants it so): a cluster-wide
// pod informer would be refused. So the agent runs one pod informer per
// served namespace, or a single one over all namespaces when the Egress
// serves "*", and changes the set as spec.clientNamespaces does: new
// informers are started (and listed) before the ones no longer wanted
// are stopped and their pods forgotten, so a namespace served all along
// never loses its clients.

// watchedNamespaces are the namespaces whose pods the agent watches for
// eg: [""] (all) when it serves "*", else its own and its
// clientNamespaces, sorted.
func watchedNamespaces(eg *skeinv1.Egress) []string {
	if slices.Contains(eg.Spec.ClientNamespaces, "*") {
		return []string{""}
	}
	out := append([]string{eg.Namespace}, eg.Spec.ClientNamespaces...)
	slices.Sort(out)
	return slices.Compact(out)
}

// covers reports whether an informer set over namespaces sees namespace ns.
func covers(namespaces []string, ns string) bool {
	return slices.Contains(namespaces, "") || slices.Contains(namespaces, ns)
}

type podInformer struct {
	factory informers.SharedInformerFactory
	inf     toolscache.SharedIndexInformer
	cancel  context.CancelFunc
}

// podInformers are the running pod informers by namespace ("" = all).
type podInformers struct {
	cs      kubernetes.Interface
	strip   func(*corev1.Pod) *corev1.Pod
	handler toolscache.ResourceEventHandler
	// forget drops the pods of the namespaces keep does not cover.
	forget func(keep func(ns string) bool)

	mu   sync.Mutex
	byNS map[string]*podInformer
}

// ensure runs informers over exactly namespaces and waits, at most
// timeout, for each to have listed once. An informer that has not (its
// namespace's grant not there yet, say) keeps trying; the error names
// it, and the next ensure waits again. Informers no longer wanted are
// stopped only once the wanted ones have listed.
func (p *podInformers) ensure(ctx context.Context, namespaces []string, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range namespaces {
		if p.byNS[ns] != nil {
			continue
		}
		ictx, cancel := context.WithCancel(ctx)
		f := informers.NewSharedInformerFactoryWithOptions(p.cs, 0, informers.WithNamespace(ns),
			informers.WithTransform(func(obj any) (any, error) {
				if pod, ok := obj.(*corev1.Pod); ok {
					return p.strip(pod), nil
				}
				return obj, nil
			}))
		inf := f.Core().V1().Pods().Informer()
		if _, err := inf.AddEventHandler(p.handler); err != nil {
			cancel()
			return fmt.Errorf("pod handler: %w", err)
		}
		f.Start(ictx.Done())
		p.byNS[ns] = &podInformer{factory: f, inf: inf, cancel: cancel}
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var unsynced []string
	for _, ns := range namespaces {
		if !toolscache.WaitForCacheSync(wctx.Done(), p.byNS[ns].inf.HasSynced) {
			unsynced = append(unsynced, ns)
		}
	}
	if len(unsynced) > 0 {
		return fmt.Errorf("pods of namespaces %q not listed within %v (may this router list and watch pods there?)", unsynced, timeout)
	}
	for ns, i := range p.byNS {
		if !slices.Contains(namespaces, ns) {
			i.cancel()
			i.factory.Shutdown()
			delete(p.byNS, ns)
		}
	}
	p.forget(func(ns string) bool { return covers(namespaces, ns) })
	return nil
}

// stop ends every informer and waits for them.
func (p *podInformers) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ns, i := range p.byNS {
		i.cancel()
		i.factory.Shutdown()
		delete(p.byNS, ns)
	}
}
