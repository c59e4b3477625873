package vm

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types020 "github.com/containernetworking/cni/pkg/types/020"

	"github.com/skeinnet/skein/internal/vm/handover"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestLegacyVersions: skein followed by skein-vm in a 0.2.0 conflist, in a
// 0.1.0 one and in one without cniVersion (0.1.0). The main plugin's
// result reaches skein-vm as a 0.x prevResult without interfaces; skein-vm
// serves its addresses on CNI_IFNAME. The chain's result is the old shape
// ({"ip4", "ip6"}: no interfaces, so the launcher learns the tap and the
// VM's MAC from the handover socket, as it always does); the VM stand-in
// leases the pod's address; DEL gives everything back.
func TestLegacyVersions(t *testing.T) {
	skeintest.RequireTool(t, "udhcpc")
	e := newEnv(t)
	for _, v := range []string{"0.1.0", "0.2.0", "none"} {
		t.Run(v, func(t *testing.T) {
			name := "vm-old-" + strings.ReplaceAll(v, ".", "")
			plugins := []skeintest.Plugin{e.d.SkeinPlugin(skeintest.Plugin{"dns": testDNS, "mtu": podMTU}), e.skeinVM(nil)}
			conf := map[string]any{"cniVersion": v, "name": name, "plugins": plugins}
			if v == "none" {
				delete(conf, "cniVersion")
			}
			b, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			l, err := libcni.ConfListFromBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			ns := harness.NewNS(t, "pod")
			id := "old" + strings.ReplaceAll(v, ".", "")
			rt := skeintest.RT(id, ns.Path(), "eth0")
			c, cancel := callCtx()
			defer cancel()
			r, err := e.cni.AddNetworkList(c, l, rt)
			if err != nil {
				t.Fatalf("ADD through skein + skein-vm (cniVersion %q): %v", l.CNIVersion, err)
			}
			t.Cleanup(func() { _ = e.del(l, rt) })
			res, ok := r.(*types020.Result)
			if !ok || res.IP4 == nil || res.IP6 == nil {
				t.Fatalf("the chain's result should be the 0.x shape with ip4 and ip6, is %T %v", r, r)
			}
			want := v
			if v == "none" {
				want = "0.1.0" // the spec's reading of a missing cniVersion
			}
			if res.CNIVersion != want {
				t.Errorf("result version %q, want %q", res.CNIVersion, want)
			}
			addr4, _ := netip.AddrFromSlice(res.IP4.IP.IP.To4())

			token, err := handover.ReadToken(e.tokenDir(), id)
			if err != nil {
				t.Fatal(err)
			}
			ifs, files, err := handover.Fetch(e.vmSocket(), id, token, 5*time.Second)
			if err != nil {
				t.Fatalf("handover: %v", err)
			}
			for _, f := range files {
				f.Close()
			}
			if len(ifs) != 1 || ifs[0].IfName != "eth0" || !strings.Contains(strings.Join(ifs[0].Addresses, " "), addr4.String()+"/32") {
				t.Fatalf("handover should describe eth0 with the result's %s, describes %+v", addr4, ifs)
			}
			p := &vmPod{ns: ns, rt: rt, vmMAC: ifs[0].MAC, tap: ifs[0].Tap}
			for _, n := range linkNames(t, ns) {
				if strings.HasPrefix(n, "skbr") {
					p.bridge = n
				}
			}
			vm, ifName := p.vmSide(t)
			if got, err := udhcpcOnce(t, vm, ifName); err != nil || got != addr4.String() {
				t.Errorf("the VM should lease the pod's %s, got %q (%v)", addr4, got, err)
			}

			if err := e.del(l, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			for _, n := range linkNames(t, ns) {
				if strings.HasPrefix(n, "skbr") || strings.HasPrefix(n, "sktap") || n == "eth0" {
					t.Errorf("after DEL of the whole chain the pod still has %s", n)
				}
			}
			if _, err := os.Stat(handover.TokenPath(e.tokenDir(), id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the token should be gone with the attachment: %v", err)
			}
		})
	}
}
