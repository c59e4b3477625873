package kurma

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/skeinnet/skein/internal/cni"
)

// ResultVersion is the CNI version results are kept and reported in.
const ResultVersion = "1.1.0"

// ConvertResult turns a plugin's stdout into a 1.1.0 result for interface
// ifname in netns. A result names its version in cniVersion; without one,
// Kurma's old {"ip4":…,"ip6":…} shape is read as 0.2.0, else the version
// of the network's config (confVersion), else 1.0.0. When the result lists
// no interface the pod's one is added and the addresses point at it.
func ConvertResult(out []byte, confVersion, ifname, netns string) (*current.Result, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return nil, errors.New("plugin printed no result")
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(out, &probe); err != nil {
		return nil, fmt.Errorf("plugin result is not a JSON object: %w (output starts %q)", err, head(out, 80))
	}
	ver := ""
	if v, ok := probe["cniVersion"]; ok {
		if err := json.Unmarshal(v, &ver); err != nil {
			return nil, fmt.Errorf("plugin result: cniVersion: %w", err)
		}
	}
	if ver == "" {
		_, ip4 := probe["ip4"]
		_, ip6 := probe["ip6"]
		switch {
		case ip4 || ip6:
			ver = "0.2.0"
		case confVersion != "":
			ver = confVersion
		default:
			ver = "1.0.0"
		}
		// The version-specific decoders want the field present.
		probe["cniVersion"], _ = json.Marshal(ver)
		withVer, err := json.Marshal(probe)
		if err != nil {
			return nil, fmt.Errorf("plugin result: %w", err)
		}
		out = withVer
	}
	return convert(out, ver, ifname, netns)
}

func convert(out []byte, ver, ifname, netns string) (*current.Result, error) {
	r, err := create.Create(ver, out)
	if err != nil {
		return nil, fmt.Errorf("decode plugin result (version %s): %w", ver, err)
	}
	r2, err := r.GetAsVersion(ResultVersion)
	if err != nil {
		return nil, fmt.Errorf("convert plugin result from %s to %s: %w", ver, ResultVersion, err)
	}
	res, ok := r2.(*current.Result)
	if !ok {
		return nil, fmt.Errorf("convert plugin result: unexpected type %T", r2)
	}
	res.CNIVersion = ResultVersion
	if ifname != "" && !cni.HasSandboxInterface(res, ifname) {
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: ifname, Sandbox: netns})
		idx := len(res.Interfaces) - 1
		for _, ip := range res.IPs {
			if ip.Interface == nil {
				ip.Interface = current.Int(idx)
			}
		}
	}
	return res, nil
}

func head(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// encodeResult renders a result as JSON (kept in records, returned by the API).
func encodeResult(r types.Result) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := r.PrintTo(&b); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(b.Bytes()), nil
}
