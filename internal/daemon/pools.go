package daemon

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/internal/cni"
)

// namespacePools is a store that knows which pool a Kubernetes namespace's
// pods use (the Kubernetes store: the namespace's skein.dev/pool
// annotation, read from an informer cache, or from the API server when
// the cache has not seen the namespace). It answers false for a namespace
// without one, and an error for a namespace it cannot read: never a
// silent fallback to the default pool.
type namespacePools interface {
	PoolForNamespace(ctx context.Context, namespace string) (string, bool, error)
}

// choosePool sets conf.Pool from the pod's namespace when the store can
// tell: namespaces are an administrator's objects, so a pod's owner cannot
// pick a pool. A pod in a namespace without the annotation, and every
// request without K8S_POD_NAMESPACE, keeps the network configuration's
// pool ("default" unless it names one).
func (d *Daemon) choosePool(ctx context.Context, conf *cni.NetConf, cniArgs string) error {
	np, ok := d.st.(namespacePools)
	if !ok {
		return nil
	}
	args, err := cni.ParseArgs(cniArgs)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: "+err.Error(), "")
	}
	ns := args["K8S_POD_NAMESPACE"]
	if ns == "" {
		return nil
	}
	p, ok, err := np.PoolForNamespace(ctx, ns)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("the pool of namespace %q cannot be known: %v", ns, err), "")
	}
	if ok {
		conf.Pool = p
	}
	return nil
}
