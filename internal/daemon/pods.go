package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/internal/store"
)

// OwnerKurma marks attachments a built-in pod network made (kurma.Pools).
const OwnerKurma = "kurma"

// PodNetworksJSON returns the podNetworks list of c, which may be written
// `podNetworks` or, as in Kurma's document, `pod_networks` (not both).
func (c Config) PodNetworksJSON() (json.RawMessage, error) {
	if len(c.PodNetworks) > 0 && len(c.PodNetworksAlias) > 0 {
		return nil, errors.New("config: both podNetworks and pod_networks are set; use one")
	}
	if len(c.PodNetworks) > 0 {
		return c.PodNetworks, nil
	}
	return c.PodNetworksAlias, nil
}

// ParsePodNetworks parses and validates the pod networks of c.
func ParsePodNetworks(c Config) ([]kurma.Network, error) {
	raw, err := c.PodNetworksJSON()
	if err != nil {
		return nil, err
	}
	return kurma.ParseNetworks(raw)
}

// startPods makes the pod network manager: images under <state>/images,
// plugin state under <state>/pod-networks, plugins run in the node's
// namespace; it finishes adds a crash interrupted.
func (d *Daemon) startPods(ctx context.Context) error {
	nets, err := ParsePodNetworks(d.cfg)
	if err != nil {
		return err
	}
	imgs, err := image.Open(image.Options{Dir: filepath.Join(d.cfg.StateDir, "images")})
	if err != nil {
		return fmt.Errorf("plugin image cache: %w", err)
	}
	// The plugins' scratch space lives beside skeind's socket (its run
	// directory: /run/skein/sandbox by default), so that a skeind given a
	// socket elsewhere, as every test's is, keeps it there too.
	scratch := filepath.Join(filepath.Dir(d.cfg.Socket), "sandbox")
	d.pods, err = kurma.NewManager(kurma.Options{
		Store:          d.st,
		Images:         imgs,
		SandboxOptions: sandbox.Options{NodeNetNS: d.dpConfig.NodeNetNS, ScratchDir: scratch},
		StateDir:       filepath.Join(d.cfg.StateDir, "pod-networks"),
		Pools:          podPools{d},
		CheckNetNS:     d.checkPodNetNS,
		Logger:         d.log.With("frontdoor", "pods"),
	})
	if err != nil {
		return err
	}
	d.pods.SetNetworks(nets)
	if err := d.pods.Recover(ctx); err != nil {
		// Recover leaves what it could not undo recorded; a later detach
		// or GC retries. Not a reason to refuse to start.
		d.log.Error("recover pod networks", "err", err)
	}
	return nil
}

// ReloadPodNetworks replaces the pod networks with those of c (SIGHUP). A
// bad config is an error and changes nothing.
func (d *Daemon) ReloadPodNetworks(c Config) error {
	nets, err := ParsePodNetworks(c)
	if err != nil {
		return err
	}
	d.pods.SetNetworks(nets)
	names := make([]string, 0, len(nets))
	for _, n := range nets {
		names = append(names, n.Name)
	}
	d.log.Info("pod networks reloaded", "networks", names)
	return nil
}

// Pods is the pod network manager, for front doors in this process.
func (d *Daemon) Pods() *kurma.Manager { return d.pods }

// podPools serves built-in ("type":"skein") pod networks through the
// daemon's own attach path, so they are ordinary attachments (reconciled,
// listed) owned by OwnerKurma.
type podPools struct{ d *Daemon }

var _ kurma.Pools = podPools{}

func (p podPools) key(r kurma.PoolRequest) store.AttachmentKey {
	return store.AttachmentKey{Network: r.Network, ContainerID: r.ContainerID, IfName: r.IfName}
}

func (p podPools) AttachPool(ctx context.Context, r kurma.PoolRequest) (json.RawMessage, error) {
	if err := p.d.checkPodNetNS(r.NetNS); err != nil {
		return nil, err
	}
	a, ap, err := p.d.Attach(ctx, AttachRequest{Key: p.key(r), Pool: r.Pool, NetNS: r.NetNS, Owner: OwnerKurma})
	if err != nil {
		return nil, err
	}
	conf := &cni.NetConf{}
	conf.CNIVersion = kurma.ResultVersion
	res, err := cni.BuildResult(conf, cni.Attached{
		HostName: a.HostLink, HostMAC: ap.HostMAC.String(), IfName: r.IfName, ContainerMAC: ap.ContainerMAC.String(),
		Sandbox: r.NetNS, Addrs: a.Addrs, GatewayV4: p.d.dpConfig.GatewayV4, GatewayV6: ap.GatewayV6,
	})
	var out []byte
	if err == nil {
		out, err = cni.Encode(res, kurma.ResultVersion)
	}
	if err != nil {
		if _, derr := p.d.Detach(context.WithoutCancel(ctx), a.AttachmentKey, r.NetNS); derr != nil {
			p.d.log.Error("undo pod pool attach after result failure", "key", a.AttachmentKey, "err", derr)
		}
		return nil, err
	}
	return out, nil
}

func (p podPools) DetachPool(ctx context.Context, r kurma.PoolRequest) error {
	_, err := p.d.Detach(ctx, p.key(r), r.NetNS)
	return err
}

// podsServer is the Pods gRPC service.
type podsServer struct {
	rpc.UnimplementedPodsServer
	d *Daemon
}

func podsError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kurma.ErrBadRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, kurma.ErrUnknownPod):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, sandbox.ErrMainExecDown):
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

func podMsg(r kurma.PodRecord) *rpc.PodStatus {
	m := &rpc.PodStatus{Id: r.ID, Netns: r.NetNS}
	for _, a := range r.Attachments {
		m.Attachments = append(m.Attachments, &rpc.PodAttachment{
			Network: a.Network, Ifname: a.IfName, Image: a.Image, Digest: a.Digest, Pool: a.Pool,
			State: a.State, Result: a.Result, Error: a.Error, Created: a.Created.Format(time.RFC3339Nano),
		})
	}
	return m
}

func (s *podsServer) Attach(ctx context.Context, in *rpc.PodAttachRequest) (*rpc.PodStatus, error) {
	start := time.Now()
	req := kurma.AttachRequest{ID: in.Id, NetNS: in.Netns}
	for _, n := range in.Networks {
		req.Networks = append(req.Networks, kurma.Selection{Network: n.Network, IfName: n.Ifname})
	}
	res, err := s.d.pods.Attach(ctx, req)
	s.d.Observe("pods", "ATTACH", code(err), time.Since(start))
	if err != nil {
		return nil, podsError(err)
	}
	m := podMsg(res.Pod)
	for _, sk := range res.Skipped {
		m.Skipped = append(m.Skipped, &rpc.PodSkipped{Network: sk.Network, Error: sk.Error})
	}
	return m, nil
}

func (s *podsServer) Detach(ctx context.Context, in *rpc.PodRef) (*rpc.Empty, error) {
	start := time.Now()
	err := s.d.pods.Detach(ctx, in.Id)
	s.d.Observe("pods", "DETACH", code(err), time.Since(start))
	return &rpc.Empty{}, podsError(err)
}

func (s *podsServer) Status(ctx context.Context, in *rpc.PodRef) (*rpc.PodStatus, error) {
	r, err := s.d.pods.Status(ctx, in.Id)
	if err != nil {
		return nil, podsError(err)
	}
	return podMsg(r), nil
}

func (s *podsServer) List(ctx context.Context, _ *rpc.Empty) (*rpc.PodList, error) {
	rs, err := s.d.pods.List(ctx)
	if err != nil {
		return nil, podsError(err)
	}
	out := &rpc.PodList{}
	for _, r := range rs {
		out.Pods = append(out.Pods, podMsg(r))
	}
	return out, nil
}

func code(err error) uint {
	if err != nil {
		return 1
	}
	return 0
}
