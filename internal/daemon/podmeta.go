package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/kurma"
)

// The CNI meta mode: a configuration {"type":"skein","podNetworks":true}
// makes the skein plugin's ADD attach the pod to pod networks (package
// internal/kurma) rather than to one pool. This file is its pure part:
// which networks a request asks for and the one result that reports them.

// NetworksAnnotation is the pod annotation naming a pod's networks, read
// from the runtimeConfig capability PodAnnotationsCapability that
// containerd and CRI-O fill in.
const NetworksAnnotation = "skein.dev/networks"

// PodAnnotationsCapability is the runtimeConfig key of the pod's
// annotations.
const PodAnnotationsCapability = "io.kubernetes.cri.pod-annotations"

// NetworksArg is the CNI_ARGS key naming a pod's networks when there is no
// annotation.
const NetworksArg = "SKEIN_NETWORKS"

// metaConf is what the meta mode reads of a configuration beyond
// cni.NetConf.
type metaConf struct {
	// Annotations are the pod's, from runtimeConfig.
	Annotations map[string]string
}

// readMeta reports whether the configuration asks for the meta mode
// ("podNetworks": true, or Kurma's spelling "pod_networks"), and reads
// the pod's annotations. A podNetworks key that is not a boolean is an
// invalid configuration (code 7).
func readMeta(netconf []byte) (metaConf, bool, error) {
	// Most configurations name no pod networks: skip decoding them whole
	// (a key can only hide from this as an escape, which is looked for).
	if !bytes.Contains(netconf, []byte("podNetworks")) && !bytes.Contains(netconf, []byte("pod_networks")) &&
		!bytes.Contains(netconf, []byte(`\u`)) {
		return metaConf{}, false, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(netconf, &top); err != nil {
		return metaConf{}, false, nil // cni.Parse reports it
	}
	on := false
	for _, k := range []string{"podNetworks", "pod_networks"} {
		raw, ok := top[k]
		if !ok {
			continue
		}
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return metaConf{}, false, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("%q in a CNI configuration must be true or false (the pod networks themselves are configured in skeind)", k), "")
		}
		on = on || b
	}
	if !on {
		return metaConf{}, false, nil
	}
	var m metaConf
	if raw, ok := top["runtimeConfig"]; ok {
		var rc struct {
			Annotations map[string]string `json:"io.kubernetes.cri.pod-annotations"`
		}
		if err := json.Unmarshal(raw, &rc); err != nil {
			return metaConf{}, false, types.NewError(types.ErrDecodingFailure, "runtimeConfig: "+err.Error(), "")
		}
		m.Annotations = rc.Annotations
	}
	return m, true, nil
}

// parseNetworkList parses a list of networks: "a@eth1, b" (the form of
// CNI_ARGS and of the annotation), or, in the annotation, a JSON array of
// names and {"name": …, "interface": …} objects (Multus's form).
func parseNetworkList(s string) ([]kurma.Selection, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		var items []json.RawMessage
		if err := json.Unmarshal([]byte(s), &items); err != nil {
			return nil, fmt.Errorf("a JSON list of networks: %w", err)
		}
		if len(items) == 0 {
			return nil, errors.New("an empty list of networks: a pod has at least one (leave the annotation out for the default networks)")
		}
		var out []kurma.Selection
		for _, it := range items {
			var name string
			if json.Unmarshal(it, &name) == nil {
				sel, err := kurma.ParseSelection(name)
				if err != nil {
					return nil, err
				}
				out = append(out, sel)
				continue
			}
			var obj struct {
				Name      string `json:"name"`
				Interface string `json:"interface"`
			}
			dec := json.NewDecoder(bytes.NewReader(it))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&obj); err != nil {
				return nil, fmt.Errorf("network %s: want a name or {\"name\", \"interface\"}: %w", it, err)
			}
			spec := obj.Name
			if obj.Interface != "" {
				spec += "@" + obj.Interface
			}
			sel, err := kurma.ParseSelection(spec)
			if err != nil {
				return nil, err
			}
			out = append(out, sel)
		}
		return out, nil
	}
	var out []kurma.Selection
	for _, part := range strings.Split(s, ",") {
		sel, err := kurma.ParseSelection(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		out = append(out, sel)
	}
	return out, nil
}

// podSelections returns the networks a meta-mode ADD attaches, in order:
// from the annotation, else from CNI_ARGS, else the default networks. The
// first takes CNI_IFNAME (naming another interface for it is an error);
// the others keep what they name or their network's containerInterface.
// It also says where the list came from, for logs.
func podSelections(m metaConf, cniArgs, ifname string, defaults []string) ([]kurma.Selection, string, error) {
	var sels []kurma.Selection
	var from string
	args, err := cni.ParseArgs(cniArgs)
	if err != nil {
		return nil, "", err
	}
	switch {
	case strings.TrimSpace(m.Annotations[NetworksAnnotation]) != "":
		from = "annotation " + NetworksAnnotation
		if sels, err = parseNetworkList(m.Annotations[NetworksAnnotation]); err != nil {
			return nil, "", types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("pod annotation %s: %v", NetworksAnnotation, err), "")
		}
	case strings.TrimSpace(args[NetworksArg]) != "":
		from = "CNI_ARGS " + NetworksArg
		if strings.HasPrefix(strings.TrimSpace(args[NetworksArg]), "[") {
			return nil, "", types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS "+NetworksArg+": want NAME[@IFNAME],… (commas; JSON only in the annotation)", "")
		}
		if sels, err = parseNetworkList(args[NetworksArg]); err != nil {
			return nil, "", types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS %s: %v", NetworksArg, err), "")
		}
	default:
		from = "default networks"
		for _, n := range defaults {
			sels = append(sels, kurma.Selection{Network: n})
		}
		if len(sels) == 0 {
			return nil, "", types.NewError(types.ErrInvalidNetworkConfig,
				"the pod names no networks (annotation "+NetworksAnnotation+" or CNI_ARGS "+NetworksArg+") and skeind has no default pod network", "")
		}
	}
	if len(sels) == 0 { // each source refuses an empty list; never index one
		return nil, "", types.NewError(types.ErrInvalidNetworkConfig, from+": no networks", "")
	}
	switch first := &sels[0]; {
	case first.IfName == "":
		first.IfName = ifname
	case first.IfName != ifname:
		return nil, "", types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("%s: the first network %q takes the runtime's interface %s (CNI_IFNAME), not %s", from, first.Network, ifname, first.IfName), "")
	}
	return sels, from, nil
}

// mergeResults joins the pod's attachments' 1.1.0 results into one: every
// interface, every address (pointing at its interface in the joined
// list), every route; the DNS of the first network that has any.
func mergeResults(atts []kurma.AttachmentRecord, netns string) (*current.Result, error) {
	out := &current.Result{CNIVersion: kurma.ResultVersion}
	for _, a := range atts {
		if a.State != kurma.StateAttached {
			continue
		}
		var r *current.Result
		if len(a.Result) > 0 {
			tr, err := create.Create(kurma.ResultVersion, a.Result)
			if err != nil {
				return nil, fmt.Errorf("result of network %q: %w", a.Network, err)
			}
			if r, err = current.NewResultFromResult(tr); err != nil {
				return nil, fmt.Errorf("result of network %q: %w", a.Network, err)
			}
		} else {
			r = &current.Result{}
		}
		base := len(out.Interfaces)
		out.Interfaces = append(out.Interfaces, r.Interfaces...)
		// A network whose result names no interface still has one.
		if a.IfName != "" && !cni.HasSandboxInterface(r, a.IfName) {
			out.Interfaces = append(out.Interfaces, &current.Interface{Name: a.IfName, Sandbox: netns})
		}
		for _, ip := range r.IPs {
			c := *ip
			if ip.Interface != nil {
				c.Interface = current.Int(*ip.Interface + base)
			}
			out.IPs = append(out.IPs, &c)
		}
		out.Routes = append(out.Routes, r.Routes...)
		if len(out.DNS.Nameservers) == 0 && len(out.DNS.Search) == 0 && len(out.DNS.Options) == 0 && out.DNS.Domain == "" {
			out.DNS = r.DNS
		}
	}
	return out, nil
}
