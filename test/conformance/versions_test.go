package conformance

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types020 "github.com/containernetworking/cni/pkg/types/020"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestLibcniEveryVerbEveryVersion drives skein the way containerd and CRI-O
// do — libcni in-process, plugin exec included — through every verb in
// every version, and without cniVersion (0.1.0): ADD (typed result of
// that version, raw shape per the spec, addresses really on eth0), CHECK
// (0.4.0+), STATUS and GC (1.1.0), DEL, DEL again, and VERSION.
func TestLibcniEveryVerbEveryVersion(t *testing.T) {
	e := newEnv(t)
	for _, v := range append(versions, noVersion) {
		t.Run(v, func(t *testing.T) {
			l := e.list(t, "lib-"+strings.ReplaceAll(v, ".", ""), v)
			ns := harness.NewNS(t, "pod")
			rt := skeintest.RT("lib-"+v, ns.Path(), "eth0")
			r, err := e.cni.AddNetworkList(cctx(t), l, rt)
			if err != nil {
				t.Fatalf("ADD (cniVersion %s): the spec expects a result, got: %v", v, err)
			}
			rv := resultVersion(v)
			checkTyped(t, r, rv)
			raw, _ := json.Marshal(r)
			for _, p := range shapeProblems(raw, rv, "eth0", ns.Path()) {
				violation(t, "the ADD result follows the Result type of the configuration's cniVersion "+rv, "%s\n  result: %s", p, raw)
			}
			res, err := types100.NewResultFromResult(r)
			if err != nil {
				t.Fatal(err)
			}
			checkKernel(t, ns, res, "eth0")
			reach(t, ns, "pod to its gateway and the node", gw4, nodeAddr)

			if v >= "0.4.0" && v != noVersion {
				if err := e.cni.CheckNetworkList(cctx(t), l, rt); err != nil {
					violation(t, "CHECK succeeds for an attachment as ADD left it", "CHECK failed: %v", err)
				}
			}
			if v >= "1.1.0" && v != noVersion {
				if err := e.cni.GetStatusNetworkList(cctx(t), l); err != nil {
					violation(t, "STATUS succeeds when the plugin is ready for ADD", "STATUS failed: %v", err)
				}
				valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: rt.ContainerID, IfName: "eth0"}}}
				if err := e.cni.GCNetworkList(cctx(t), l, valid); err != nil {
					violation(t, "GC succeeds", "GC listing the attachment as valid failed: %v", err)
				}
				if n := len(e.d.Attachments(t)); n != 1 {
					violation(t, "GC leaves the attachments listed in cni.dev/valid-attachments alone", "after GC skeind holds %d attachments, want 1", n)
				}
			}
			if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
				violation(t, "DEL succeeds", "DEL failed: %v", err)
			}
			if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
				violation(t, "DEL of something already deleted succeeds", "second DEL failed: %v", err)
			}
			e.assertClean(t, "DEL")
		})
	}

	t.Run("VERSION", func(t *testing.T) {
		info, err := e.cni.GetVersionInfo(cctx(t), "skein")
		if err != nil {
			t.Fatalf("VERSION through libcni: %v", err)
		}
		if got := info.SupportedVersions(); !sameSet(got, versions) {
			violation(t, "VERSION lists the spec versions the plugin supports", "it lists %v; skein accepts %v", got, versions)
		}
		for _, v := range append(versions, noVersion) {
			conf := map[string]any{"cniVersion": v}
			if v == noVersion {
				conf = map[string]any{}
			}
			out, serr := e.exec(t, call{cmd: "VERSION", conf: conf})
			if serr != nil {
				violation(t, "VERSION succeeds for any cniVersion on stdin", "VERSION with cniVersion %s failed: %v", v, serr)
				continue
			}
			var got struct {
				CNIVersion        string   `json:"cniVersion"`
				SupportedVersions []string `json:"supportedVersions"`
			}
			if err := json.Unmarshal(out, &got); err != nil || got.CNIVersion == "" || !sameSet(got.SupportedVersions, versions) {
				violation(t, `VERSION prints {"cniVersion", "supportedVersions"} listing every supported version`, "printed %s", out)
			}
		}
	})
}

// TestOldVersionsRefuseNewVerbs: CHECK came with 0.4.0, STATUS and GC with
// 1.1.0; asked for them with an older configuration (or one without
// cniVersion, which is 0.1.0) the plugin refuses with code 1
// (incompatible version) and changes nothing.
func TestOldVersionsRefuseNewVerbs(t *testing.T) {
	e := newEnv(t)
	ns := harness.NewNS(t, "pod")
	for _, c := range []struct {
		verb string
		vs   []string
	}{
		{"CHECK", []string{noVersion, "0.1.0", "0.2.0", "0.3.0", "0.3.1"}},
		{"STATUS", []string{noVersion, "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"}},
		{"GC", []string{noVersion, "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"}},
	} {
		for _, v := range c.vs {
			conf := map[string]any{"cniVersion": v, "name": "old"}
			if v == noVersion {
				delete(conf, "cniVersion")
			}
			_, serr := e.exec(t, call{cmd: c.verb, id: "old", netns: ns.Path(), ifname: "eth0", conf: conf})
			if serr == nil {
				violation(t, c.verb+" does not exist in spec "+v+": the plugin must refuse it", "%s with cniVersion %s succeeded", c.verb, v)
			} else if serr.Code != types.ErrIncompatibleCNIVersion {
				violation(t, c.verb+" with cniVersion "+v+" is an incompatible version (code 1)", "code %d: %s", serr.Code, serr.Msg)
			}
		}
	}
	e.assertClean(t, "refused verbs")
}

// TestNoVersionIs010: run as a runtime runs it, with a configuration that
// names no cniVersion, skein answers ADD with a 0.1.0 result and reports
// errors as 0.1.0; DEL works. The reference plugins behave so (skel reads
// a missing version as 0.1.0).
func TestNoVersionIs010(t *testing.T) {
	e := newEnv(t)
	ns := harness.NewNS(t, "pod")
	conf := map[string]any{"name": "nover"}
	add := call{cmd: "ADD", id: "nover", netns: ns.Path(), ifname: "eth0", conf: conf}
	out, serr := e.exec(t, add)
	if serr != nil {
		t.Fatalf("ADD without cniVersion: the spec reads it as 0.1.0 and expects a result, got: %v", serr)
	}
	for _, p := range shapeProblems(out, "0.1.0", "eth0", ns.Path()) {
		violation(t, "a configuration without cniVersion gets a 0.1.0 result", "%s\n  result: %s", p, out)
	}
	bad := add
	bad.id = "nover2"
	bad.netns = "/nonexistent/netns"
	raw, serr := e.exec(t, bad)
	if serr == nil {
		t.Fatal("ADD into a missing namespace should fail")
	}
	var got struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || got.CNIVersion != "0.1.0" {
		violation(t, "the error of a configuration without cniVersion carries its version, 0.1.0", "printed %s", raw)
	}
	del := add
	del.cmd = "DEL"
	if _, serr := e.exec(t, del); serr != nil {
		violation(t, "DEL succeeds", "DEL without cniVersion failed: %v", serr)
	}
	e.assertClean(t, "DEL without cniVersion")
}

// checkTyped: libcni gives the result in the concrete type of its version.
func checkTyped(t *testing.T, r types.Result, v string) {
	t.Helper()
	if r.Version() != v {
		violation(t, "the result's cniVersion is the configuration's", "result version %s, configuration %s", r.Version(), v)
	}
	switch r.(type) {
	case *types020.Result:
		if v >= "0.3.0" {
			t.Errorf("libcni decoded a %s result as types020", v)
		}
	case *types040.Result:
		if v >= "1.0.0" || v < "0.3.0" {
			t.Errorf("libcni decoded a %s result as types040", v)
		}
	case *types100.Result:
		if v < "1.0.0" {
			t.Errorf("libcni decoded a %s result as types100", v)
		}
	default:
		t.Errorf("unexpected result type %T", r)
	}
}

// checkKernel: every address the result gives ifName is on it in the pod,
// as a host route (/32, /128).
func checkKernel(t *testing.T, ns *harness.NS, res *types100.Result, ifName string) {
	t.Helper()
	h := ns.Handle(t)
	l, err := h.LinkByName(ifName)
	if err != nil {
		violation(t, "ADD creates CNI_IFNAME in the sandbox", "no %s in the pod: %v", ifName, err)
		return
	}
	addrs, err := h.AddrList(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, a := range addrs {
		have = append(have, a.IPNet.String())
	}
	for _, ip := range res.IPs {
		if !slices.Contains(have, ip.Address.String()) {
			violation(t, "the result describes what the plugin configured", "result address %s is not on %s (it has %v)", ip.Address.String(), ifName, have)
		}
		if ones, bits := ip.Address.Mask.Size(); ones != bits {
			t.Errorf("skein documents host-route addresses (/32, /128); result has %s", ip.Address.String())
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// addrsOf returns the container addresses a 1.0 result gives ifName.
func addrsOf(res *types100.Result, ifName string) []netip.Addr {
	var out []netip.Addr
	for _, ip := range res.IPs {
		if ip.Interface != nil && *ip.Interface < len(res.Interfaces) && res.Interfaces[*ip.Interface].Name == ifName {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}
