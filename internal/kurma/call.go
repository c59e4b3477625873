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

// del runs one attachment's del from its record: the config and image
// digest it was added with, whatever the config says now.
func (m *Manager) del(ctx context.Context, rec *PodRecord, a AttachmentRecord) error {
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
		// Pruned or lost: fetch the same digest again.
		var ref image.Ref
		if ref, err = image.Parse(refetchSource(a)); err == nil {
			img, release, err = m.images.Acquire(ctx, ref)
		}
	}
	if err != nil {
		return fmt.Errorf("image %s of network %q: %w", a.Digest, a.Network, err)
	}
	defer release()
	_, err = m.call(ctx, sandbox.OpDel, rec, a, img)
	return err
}

// refetchSource is where a del fetches a pruned image from: the recorded
// reference and digest, plain http allowed if the add allowed it (the
// record's flag, or the recorded config's for records older than it).
func refetchSource(a AttachmentRecord) image.Source {
	insecure := a.Insecure
	if !insecure {
		var c struct {
			Insecure bool `json:"insecure"`
		}
		_ = json.Unmarshal(a.Config, &c)
		insecure = c.Insecure
	}
	return image.Source{Image: a.Image, Digest: a.Digest, AllowTags: true, Insecure: insecure}
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
