package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
)

// add runs one network's add: skeind's own pools for a built-in network,
// else /opt/network/add of its image in a sandbox.
func (m *Manager) add(ctx context.Context, rec *PodRecord, a AttachmentRecord, s *netState) (*current.Result, error) {
	if a.Builtin() {
		out, err := m.pools.AttachPool(ctx, poolRequest(rec, a))
		if err != nil {
			return nil, err
		}
		return ConvertResult(out, "", a.IfName, rec.NetNS)
	}
	out, err := m.call(ctx, sandbox.OpAdd, rec, a, s.img)
	if err != nil {
		return nil, err
	}
	return ConvertResult(out, confVersion(a.Config), a.IfName, rec.NetNS)
}

// ErrImageGone is wrapped by a del's error when the image its record
// names is no longer in the cache: a del never fetches an image (it must
// not wait on a registry, and the source may have changed since), and
// images a record names are kept until the record is gone.
var ErrImageGone = errors.New("the image is no longer in the cache")

// del runs one attachment's del from its record: the config and image
// digest it was added with, whatever the config says now. It is bounded
// by the attachment's timeout as a whole, whatever the caller's context.
func (m *Manager) del(ctx context.Context, rec *PodRecord, a AttachmentRecord) error {
	timeout := a.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if a.Builtin() {
		if m.pools == nil {
			return ErrNoPools
		}
		return m.pools.DetachPool(ctx, poolRequest(rec, a))
	}
	if m.images == nil {
		return errors.New("no image cache configured")
	}
	img, release, err := m.images.Lookup(a.Digest)
	if errors.Is(err, image.ErrNotCached) {
		err = fmt.Errorf("%w (restore %s to the cache, or remove the pod's record by hand)", ErrImageGone, a.Image)
	}
	if err != nil {
		return fmt.Errorf("image %s of network %q: %w", a.Digest, a.Network, err)
	}
	defer release()
	_, err = m.call(ctx, sandbox.OpDel, rec, a, img)
	return err
}

func (m *Manager) call(ctx context.Context, op sandbox.Op, rec *PodRecord, a AttachmentRecord, img image.Image) ([]byte, error) {
	dir, err := m.stateDir(a.Network)
	if err != nil {
		return nil, err
	}
	p := sandbox.Plugin{Rootfs: img.Root, Config: a.Config, StateDir: dir, Env: img.Env, Timeout: a.Timeout}
	_, runner, err := m.sandbox()
	if err != nil {
		return nil, err
	}
	spec := p.Call(op, rec.NetNS, rec.ID, a.IfName)
	if op == sandbox.OpDel && isNetNS(rec.NetNS) != nil {
		// The pod's namespace is gone (CNI: DEL must still succeed): the
		// plugin gets its path as the argument but nothing is bound there,
		// so it frees what lives outside the namespace.
		spec.NetNS = ""
	}
	r, err := runner.Run(ctx, rec.ID, spec)
	if err != nil {
		return nil, err
	}
	if len(r.Stderr) > 0 {
		m.log.Debug("plugin stderr", "op", op, "pod", rec.ID, "network", a.Network, "stderr", string(r.Stderr))
	}
	return r.Stdout, nil
}

func poolRequest(rec *PodRecord, a AttachmentRecord) PoolRequest {
	return PoolRequest{Network: a.Network, Pool: a.Pool, ContainerID: rec.ID, NetNS: rec.NetNS, IfName: a.IfName}
}

func confVersion(conf json.RawMessage) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(conf, &c)
	return c.CNIVersion
}
