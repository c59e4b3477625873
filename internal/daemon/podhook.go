package daemon

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
)

// PodHook is work a Kubernetes-mode feature does on a pod's CNI ADD and
// DEL beyond its interface (egress tunnels: package internal/podegress).
// Only CNI requests naming the pod (K8S_POD_NAMESPACE and K8S_POD_NAME in
// CNI_ARGS) reach it, in the pool mode and the meta mode (pod networks)
// alike.
type PodHook interface {
	// Added runs once the pod's interface and addresses are in place,
	// before the ADD replies. An error fails the ADD: the daemon then
	// tears the attachment down (the address is freed, the veth goes), so
	// the hook must itself leave nothing of its own behind on error. A
	// *types.Error keeps its code; any other error is code 999.
	Added(ctx context.Context, pod PodRef) error
	// Deleting wraps a DEL: it undoes the hook's work in the pod (best
	// effort: a namespace that is gone is skipped, a failure is logged,
	// never returned) and runs detach, the DEL's teardown, while holding
	// whatever serialises its own work on the pod. It returns detach's
	// error.
	Deleting(ctx context.Context, pod PodRef, detach func() error) error
}

// PodRef names the pod of a CNI request.
type PodRef struct {
	// Namespace and Name of the Pod object (K8S_POD_NAMESPACE,
	// K8S_POD_NAME).
	Namespace, Name string
	// ContainerID is the sandbox's CNI_CONTAINERID, IfName the request's
	// CNI_IFNAME (a pod may have several interfaces, each ADDed and DELed
	// on its own: Multus' secondary networks).
	ContainerID, IfName string
	// NetNS is CNI_NETNS: the pod's network namespace ("" or a path that
	// no longer exists on DEL).
	NetNS string
}

// podRefOf reads the pod of a request from CNI_ARGS; false when the
// request names none (not from a kubelet) or skeind has no pod hook.
func (d *Daemon) podRefOf(cniArgs, containerID, ifName, netnsPath string) (PodRef, bool, error) {
	if d.cfg.PodHook == nil {
		return PodRef{}, false, nil
	}
	args, err := cni.ParseArgs(cniArgs)
	if err != nil {
		return PodRef{}, false, err // code 4, naming CNI_ARGS
	}
	ns, name := args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]
	if ns == "" || name == "" {
		return PodRef{}, false, nil
	}
	return PodRef{Namespace: ns, Name: name, ContainerID: containerID, IfName: ifName, NetNS: netnsPath}, true, nil
}

// podAdded runs the pod hook of a successful ADD (nil when the request
// names no pod); its error keeps a CNI code (999 unless it has one).
func (s *cniServer) podAdded(ctx context.Context, req *rpc.CNIRequest) error {
	pod, ok, err := s.d.podRefOf(req.Args, req.ContainerId, req.Ifname, req.Netns)
	if err != nil || !ok {
		return err
	}
	if err := s.d.cfg.PodHook.Added(ctx, pod); err != nil {
		if e := (*types.Error)(nil); errors.As(err, &e) {
			return e
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}
