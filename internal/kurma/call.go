package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/skeinnet/skein/internal/cni"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
)

// add runs one network's add: skeind's own pools for a built-in network,
// else /opt/network/add of its image in a sandbox, started once wait (if
// set) lets it (sandbox.Spec.Wait).
func (m *Manager) add(ctx context.Context, rec *PodRecord, a AttachmentRecord, s *netState, wait func(context.Context) error) (*current.Result, error) {
	if a.Builtin() {
		out, err := m.pools.AttachPool(ctx, poolRequest(rec, a))
		if err != nil {
			return nil, err
		}
		return ConvertResult(out, "", a.IfName, rec.NetNS)
	}
	out, err := m.call(ctx, sandbox.OpAdd, rec, a, s.img, wait)
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
	_, err = m.call(ctx, sandbox.OpDel, rec, a, img, nil)
	return err
}

func (m *Manager) call(ctx context.Context, op sandbox.Op, rec *PodRecord, a AttachmentRecord, img image.Image, wait func(context.Context) error) ([]byte, error) {
	dir, err := m.stateDir(a.Network)
	if err != nil {
		return nil, err
	}
	p := sandbox.Plugin{Rootfs: img.Root, Config: a.Config, StateDir: dir, Env: img.Env, Timeout: a.Timeout}
	_, runner, err := m.sandbox()
	if err != nil {
		return nil, err
	}
	gone := op == sandbox.OpDel && isNetNS(rec.NetNS) != nil
	var spec sandbox.Spec
	if len(img.CNIPlugins) > 0 {
		if spec, err = cniSpec(op, rec, a, img, dir, gone); err != nil {
			return nil, err
		}
	} else {
		spec = p.Call(op, rec.NetNS, rec.ID, a.IfName)
	}
	if gone {
		// The pod's namespace is gone (CNI: DEL must still succeed): the
		// plugin gets its path as the argument but nothing is bound there,
		// so it frees what lives outside the namespace.
		spec.NetNS = ""
	}
	spec.Wait = wait
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

// cniBinDir is where pack-cni images keep their CNI plugins.
const cniBinDir = "/opt/cni/bin"

// cniSpec calls a pack-cni image's CNI plugin directly, as the image's
// shim (skein-netplugin) would, without the shim's own start and fork:
// CNI's environment (the image's, CNI_* variables of it dropped), the
// network's config on stdin, and on DEL the ADD result from the record as
// prevResult (CNI 0.4.0 and later) where the config has none. The plugin
// must be one the image's label names. When the pod's namespace is gone
// (gone), a DEL runs without CNI_NETNS, so the plugin frees what lives
// outside it.
func cniSpec(op sandbox.Op, rec *PodRecord, a AttachmentRecord, img image.Image, stateDir string, gone bool) (sandbox.Spec, error) {
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(a.Config, &conf); err != nil {
		return sandbox.Spec{}, fmt.Errorf("network %q: config: %w", a.Network, err)
	}
	var typ, ver string
	_ = json.Unmarshal(conf["type"], &typ)
	_ = json.Unmarshal(conf["cniVersion"], &ver)
	if !slices.Contains(img.CNIPlugins, typ) {
		return sandbox.Spec{}, fmt.Errorf("network %q: plugin type %q is not one of those its image packs (%s)", a.Network, typ, strings.Join(img.CNIPlugins, ", "))
	}
	stdin := []byte(a.Config)
	if _, has := conf["prevResult"]; op == sandbox.OpDel && !has && len(a.Result) > 0 && cniPrevResult(ver) {
		if prev, err := resultAs(a.Result, ver); err == nil {
			conf["prevResult"] = prev
			if b, err := json.Marshal(conf); err == nil {
				stdin = b
			}
		}
		// Not fatal otherwise: DEL works without prevResult for most
		// plugins (the shim does the same).
	}
	command := "ADD"
	if op == sandbox.OpDel {
		command = "DEL"
	}
	netns := rec.NetNS
	if gone {
		netns = ""
	}
	env := make([]string, 0, len(img.Env)+5)
	for _, e := range img.Env {
		if !strings.HasPrefix(e, "CNI_") {
			env = append(env, e)
		}
	}
	env = append(env, "CNI_COMMAND="+command, "CNI_CONTAINERID="+rec.ID, "CNI_NETNS="+netns,
		"CNI_IFNAME="+a.IfName, "CNI_PATH="+cniBinDir)
	return sandbox.Spec{
		Rootfs: img.Root, Path: cniBinDir + "/" + typ, Stdin: stdin, Env: env,
		NetNS: rec.NetNS, StateDir: stateDir, Timeout: a.Timeout,
	}, nil
}

// cniPrevResult reports whether CNI version v passes prevResult to DEL.
func cniPrevResult(v string) bool {
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	return err1 == nil && err2 == nil && (ma > 0 || mi >= 4)
}

// resultAs converts a recorded result to CNI version ver.
func resultAs(raw json.RawMessage, ver string) (json.RawMessage, error) {
	r, err := create.CreateFromBytes(raw)
	if err != nil {
		return nil, err
	}
	return cni.Encode(r, ver)
}
