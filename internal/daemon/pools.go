package daemon

import (
	"context"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/internal/cni"
)

// namespacePools is a store that knows which pool a Kubernetes namespace's
// pods use (the Kubernetes store: the namespace's skein.dev/pool
// annotation, read from an informer cache). It answers false for a
// namespace without one, or one it does not know.
type namespacePools interface {
	PoolForNamespace(ctx context.Context, namespace string) (string, bool)
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
	if p, ok := np.PoolForNamespace(ctx, ns); ok {
		conf.Pool = p
	}
	return nil
}
