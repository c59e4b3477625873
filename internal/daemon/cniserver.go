package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
)

// cniServer is the CNI front door: one method per verb, each a short
// recipe over Attach/Detach.
type cniServer struct {
	rpc.UnimplementedCNIServer
	d *Daemon
}

// OwnerCNI marks attachments made through the CNI front door.
const OwnerCNI = "cni"

func reply(result []byte, err error) (*rpc.CNIReply, error) {
	if err == nil {
		return &rpc.CNIReply{Result: result}, nil
	}
	e := cni.AsError(err)
	return &rpc.CNIReply{Error: &rpc.CNIError{Code: uint32(e.Code), Msg: e.Msg, Details: e.Details}}, nil
}

func (s *cniServer) observe(verb string, start time.Time, err error) {
	code := uint(0)
	if err != nil {
		code = cni.AsError(err).Code
	}
	s.d.metrics.observe("cni", verb, code, time.Since(start))
	if err != nil {
		s.d.log.Warn("cni request failed", "verb", verb, "code", code, "err", err)
	}
}

// validateArgs checks the request's environment (spec code 4) and parses
// the network configuration (codes 1, 6, 7).
func (s *cniServer) validateArgs(req *rpc.CNIRequest, needNetNS bool) (*cni.NetConf, error) {
	conf, err := cni.Parse(req.Netconf)
	if err != nil {
		return nil, err
	}
	if err := cni.ValidateContainerID(req.ContainerId); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if err := cni.ValidateIfName(req.Ifname); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if needNetNS {
		if err := netns.IsNetNS(req.Netns); err != nil {
			if errors.Is(err, netns.ErrNotExist) {
				return nil, types.NewError(types.ErrUnknownContainer, fmt.Sprintf("CNI_NETNS %q does not exist", req.Netns), "")
			}
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q is not a network namespace", req.Netns), err.Error())
		}
		if err := s.d.checkPodNetNS(req.Netns); err != nil {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
		}
	}
	return conf, nil
}

func keyOf(conf *cni.NetConf, req *rpc.CNIRequest) store.AttachmentKey {
	return store.AttachmentKey{Network: conf.Name, ContainerID: req.ContainerId, IfName: req.Ifname}
}

func (s *cniServer) Add(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	res, err := s.add(ctx, req)
	s.observe("ADD", start, err)
	return reply(res, err)
}

func (s *cniServer) add(ctx context.Context, req *rpc.CNIRequest) ([]byte, error) {
	if m, ok, err := readMeta(req.Netconf); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return s.addPods(ctx, req, m)
	}
	conf, err := s.validateArgs(req, true)
	if err != nil {
		return nil, err
	}
	static, err := cni.StaticIPs(conf, req.Args)
	if err != nil {
		return nil, err
	}
	if err := s.d.choosePool(ctx, conf, req.Args); err != nil {
		return nil, err
	}
	a, ap, err := s.d.Attach(ctx, AttachRequest{
		Key:    keyOf(conf, req),
		Pool:   conf.Pool,
		NetNS:  req.Netns,
		Static: static,
		MTU:    conf.MTU,
		Owner:  OwnerCNI,
	})
	if err != nil {
		return nil, attachError(err, conf)
	}
	out, err := cni.EncodeResult(conf, cni.Attached{
		HostName:     a.HostLink,
		HostMAC:      ap.HostMAC.String(),
		IfName:       req.Ifname,
		ContainerMAC: ap.ContainerMAC.String(),
		Sandbox:      req.Netns,
		Addrs:        a.Addrs,
		GatewayV4:    s.d.dpConfig.GatewayV4,
		GatewayV6:    ap.GatewayV6,
	})
	// The pod's own set-up (egress) once its interface is in place.
	if err == nil {
		err = s.podAdded(ctx, req)
	}
	if err == nil {
		return out, nil
	}
	// The result cannot be rendered, or the pod's set-up failed: undo, so
	// nothing is left behind.
	if _, derr := s.d.Detach(context.WithoutCancel(ctx), a.AttachmentKey, req.Netns); derr != nil {
		s.d.log.Error("undo ADD after a failure", "key", a.AttachmentKey, "cause", err, "err", derr)
	}
	return nil, err
}

// attachError maps Attach failures onto spec error codes.
func attachError(err error, conf *cni.NetConf) error {
	var e *types.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, ipam.ErrPoolNotFound):
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("pool %q does not exist", conf.Pool), err.Error())
	case errors.Is(err, ipam.ErrTryAgain):
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("no block of pool %q could be had in time; try again", conf.Pool), err.Error())
	case errors.Is(err, ipam.ErrExhausted):
		return types.NewError(cni.CodePoolExhausted, fmt.Sprintf("pool %q has no free address", conf.Pool), err.Error())
	case errors.Is(err, ipam.ErrOutOfPool):
		return types.NewError(types.ErrInvalidNetworkConfig, "requested address is not in pool "+conf.Pool, err.Error())
	case errors.Is(err, ipam.ErrInUse), errors.Is(err, ipam.ErrReserved):
		return types.NewError(cni.CodeAddressUnavailable, "requested address is not available", err.Error())
	case errors.Is(err, ErrAttachmentExists):
		return types.NewError(cni.CodeAttachmentExists, "this container already has an interface on this network with that name", err.Error())
	case errors.Is(err, dataplane.ErrLinkExists):
		return types.NewError(types.ErrInvalidEnvironmentVariables, "an interface with that name already exists", err.Error())
	case errors.Is(err, dataplane.ErrNetNSNotExist):
		return types.NewError(types.ErrUnknownContainer, "the container's network namespace is gone", err.Error())
	case errors.Is(err, dataplane.ErrNotNetNS):
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is not a network namespace", err.Error())
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

func (s *cniServer) Del(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	err := s.del(ctx, req)
	s.observe("DEL", start, err)
	return reply(nil, err)
}

// del succeeds when the netns, the link or the record is already gone: the
// spec asks DEL to be idempotent.
func (s *cniServer) del(ctx context.Context, req *rpc.CNIRequest) error {
	if m, ok, err := readMeta(req.Netconf); err != nil || ok {
		if err != nil {
			return err
		}
		return s.delPods(ctx, req, m)
	}
	conf, err := s.validateArgs(req, false)
	if err != nil {
		return err
	}
	nsPath := req.Netns
	if nsPath != "" && netns.IsNetNS(nsPath) != nil {
		nsPath = "" // gone: the host side is enough
	}
	detach := func() error {
		_, err := s.d.Detach(ctx, keyOf(conf, req), nsPath)
		return err
	}
	// A CNI_ARGS that does not parse names no pod: DEL goes on.
	pod, hasPod, _ := s.d.podRefOf(req.Args, req.ContainerId, req.Ifname, nsPath)
	if hasPod {
		err = s.d.cfg.PodHook.Deleting(ctx, pod, detach)
	} else {
		err = detach()
	}
	if err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

func (s *cniServer) Check(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	err := s.check(ctx, req)
	s.observe("CHECK", start, err)
	return reply(nil, err)
}

func (s *cniServer) check(ctx context.Context, req *rpc.CNIRequest) error {
	if _, ok, err := readMeta(req.Netconf); err != nil || ok {
		if err != nil {
			return err
		}
		return s.checkPods(ctx, req)
	}
	conf, err := s.validateArgs(req, true)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult", "")
	}
	k := keyOf(conf, req)
	a, err := s.d.st.GetAttachment(ctx, k)
	if errors.Is(err, store.ErrNotFound) {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("no attachment %s", k), "")
	}
	if err != nil {
		return err
	}
	prev, err := cni.PrevAddrs(conf, req.Ifname)
	if err != nil {
		return err
	}
	for _, ad := range a.Addrs {
		if !slices.Contains(prev, ad) {
			return types.NewError(cni.CodeCheckFailed, fmt.Sprintf("prevResult lacks address %v of interface %s", ad, req.Ifname), "")
		}
	}
	mac, _ := net.ParseMAC(a.ContainerMAC)
	if err := s.d.dp.Check(dataplane.Link{HostName: a.HostLink, Alias: s.d.aliasFor(k), NetNS: req.Netns, IfName: req.Ifname, Addrs: a.Addrs, MTU: conf.MTU, ContainerMAC: mac}); err != nil {
		return types.NewError(cni.CodeCheckFailed, err.Error(), "")
	}
	return nil
}

func (s *cniServer) Status(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	err := s.status(ctx, req)
	s.observe("STATUS", start, err)
	return reply(nil, err)
}

// status: skeind answers, so the plugin is available if the network's pool
// exists and has room on this node or in unclaimed blocks.
func (s *cniServer) status(ctx context.Context, req *rpc.CNIRequest) error {
	if _, ok, err := readMeta(req.Netconf); err != nil || ok {
		if err != nil {
			return err
		}
		return s.statusPods(ctx, req)
	}
	conf, err := cni.Parse(req.Netconf)
	if err != nil {
		return err
	}
	// Room: an address of each family the pool has, in a block this
	// node can hand out from or one it can claim (reserved blocks and
	// each family counted apart): an ADD right after a STATUS that said
	// yes gets its addresses, unless another call took them first.
	err = s.d.ipam.Room(ctx, conf.Pool)
	switch {
	case errors.Is(err, ipam.ErrPoolNotFound):
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("pool %q does not exist", conf.Pool), "")
	case errors.Is(err, ipam.ErrExhausted):
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("pool %q is exhausted: %v", conf.Pool, err), "")
	case err != nil:
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}

func (s *cniServer) GC(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	err := s.gc(ctx, req)
	s.observe("GC", start, err)
	return reply(nil, err)
}

// gc removes every CNI attachment of this network that the runtime does not
// list in cni.dev/valid-attachments — as of when the request started: an
// ADD still running then, or one begun since, is not in the runtime's list
// but is not garbage either (Daemon.Collect).
func (s *cniServer) gc(ctx context.Context, req *rpc.CNIRequest) error {
	if _, ok, err := readMeta(req.Netconf); err != nil || ok {
		if err != nil {
			return err
		}
		return s.gcPods(ctx, req)
	}
	since := time.Now()
	busy := s.d.adds.snapshot()
	conf, err := cni.Parse(req.Netconf)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, v := range conf.ValidAttachments {
		valid[v] = true
	}
	all, err := s.d.st.ListAttachments(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range all {
		if a.Network != conf.Name || a.Owner != OwnerCNI || valid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			continue
		}
		nsPath := a.NetNS
		if netns.IsNetNS(nsPath) != nil {
			nsPath = ""
		}
		removed, err := s.d.Collect(ctx, a.AttachmentKey, nsPath, since, busy)
		if err != nil {
			errs = append(errs, err)
		} else if removed {
			s.d.log.Info("gc: removed stale attachment", "key", a.AttachmentKey, "addrs", a.Addrs)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "gc: "+err.Error(), "")
	}
	return nil
}
