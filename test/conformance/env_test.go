package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// versions are the spec versions skein accepts: every one the spec had.
var versions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// noVersion stands for a configuration without "cniVersion", which the
// spec and libcni read as 0.1.0.
const noVersion = "none"

// resultVersion is the version of the result a configuration of version v
// gets.
func resultVersion(v string) string {
	if v == noVersion {
		return "0.1.0"
	}
	return v
}

// refMaxVersion is the newest spec version Debian's reference plugins
// (containernetworking-plugins 1.1.1) accept.
const refMaxVersion = "1.0.0"

var (
	gw4 = netip.MustParseAddr("169.254.1.1")
	gw6 = netip.MustParseAddr("fe80::1")
	// nodeAddr is put on the node's lo so that pods have a node address to
	// reach that is not their gateway.
	nodeAddr = netip.MustParseAddr("198.51.100.1")
)

// violation reports a conformance failure: what the spec requires and what
// skein did.
func violation(t testing.TB, spec, format string, args ...any) {
	t.Helper()
	t.Errorf("\n  spec:  %s\n  skein: %s", spec, fmt.Sprintf(format, args...))
}

// env is one skeind serving one node namespace.
type env struct {
	d    *skeintest.Daemon
	cni  *libcni.CNIConfig
	base harness.State // node namespace right after start (+ nodeAddr)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	harness.RequireRoot(t)
	d := skeintest.StartDaemon(t, skeintest.Options{})
	d.Node.AddAddr(t, "lo", netip.PrefixFrom(nodeAddr, 32))
	return &env{d: d, cni: d.CNI(), base: nodeState(t, d)}
}

// nodeState snapshots a node namespace, its export table checked against
// the blocks skeind owns (skeintest.Daemon.NodeState).
func nodeState(t testing.TB, d *skeintest.Daemon) harness.State {
	t.Helper()
	return d.NodeState(t)
}

// assertClean: the node is as it was at start and skeind holds nothing.
func (e *env) assertClean(t *testing.T, after string) {
	t.Helper()
	harness.AssertSame(t, e.base, nodeState(t, e.d))
	if atts := e.d.Attachments(t); len(atts) != 0 {
		violation(t, "DEL (and GC) release everything ADD created",
			"after %s skeind still holds %d attachment(s): %s", after, len(atts), keys(atts))
	}
}

func keys(atts []*rpc.Attachment) string {
	var s []string
	for _, a := range atts {
		s = append(s, a.Network+"/"+a.ContainerId+"/"+a.Ifname)
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}

// list is a conflist of skein and extra in version (noVersion: without
// cniVersion).
func (e *env) list(t testing.TB, name, version string, extra ...skeintest.Plugin) *libcni.NetworkConfigList {
	t.Helper()
	plugins := append([]skeintest.Plugin{e.d.SkeinPlugin(nil)}, extra...)
	if version != noVersion {
		return skeintest.ConfList(t, name, version, plugins...)
	}
	b, err := json.Marshal(map[string]any{"name": name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist without cniVersion: %v", err)
	}
	return l
}

func cctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// call is one raw execution of the skein binary, as a runtime performs it.
type call struct {
	cmd, id, netns, ifname, args string
	conf                         map[string]any
}

// exec runs the skein binary with the CNI environment of c and c.conf on
// stdin (plus "socket"). It returns stdout and, when the plugin exits
// non-zero, the spec error it printed; a non-zero exit without one fails
// the test (the spec requires the error on stdout).
func (e *env) exec(t testing.TB, c call) ([]byte, *types.Error) {
	t.Helper()
	conf := map[string]any{"type": "skein", "socket": e.d.Socket}
	for k, v := range c.conf {
		conf[k] = v
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	r, err := skeintest.ExecPlugin(filepath.Join(e.d.BinDir, "skein"), []string{
		"PATH=" + os.Getenv("PATH"),
		"CNI_COMMAND=" + c.cmd, "CNI_CONTAINERID=" + c.id, "CNI_NETNS=" + c.netns,
		"CNI_IFNAME=" + c.ifname, "CNI_ARGS=" + c.args, "CNI_PATH=" + e.d.BinDir,
	}, stdin)
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit == 0 {
		return r.Stdout, nil
	}
	if r.SpecErr == nil || r.SpecErr.Msg == "" {
		violation(t, "a failing plugin prints {cniVersion, code, msg[, details]} on stdout and exits non-zero",
			"%s exited %d with stdout %q, stderr %q", c.cmd, r.Exit, r.Stdout, r.Stderr)
		return r.Stdout, &types.Error{Code: 0, Msg: "no spec error"}
	}
	var raw map[string]any
	_ = json.Unmarshal(r.Stdout, &raw)
	if _, ok := raw["cniVersion"]; !ok {
		violation(t, "the error result carries cniVersion", "%s printed %s", c.cmd, r.Stdout)
	}
	return r.Stdout, r.SpecErr
}

// wantCode checks that err is a spec error with code.
func wantCode(t testing.TB, what, spec string, err error, code uint) {
	t.Helper()
	if err == nil {
		violation(t, spec, "%s succeeded; expected error code %d", what, code)
		return
	}
	if got := skeintest.ErrCode(err); got != code {
		violation(t, spec, "%s failed with code %d (%v); expected code %d", what, got, err, code)
	}
}

// ping pings addr from ns, retrying briefly (a new neighbour entry may cost
// the first packet).
func reach(t testing.TB, from *harness.NS, what string, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		var err error
		for i := 0; i < 3; i++ {
			if err = harness.Ping(t, from, a); err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("%s: %s should answer ping from %s: %v", what, a, from.Name(), err)
		}
	}
}

// tool finds an external program or skips: the suite drives clients other
// people wrote, and `make deps` installs them (cnitool in a cache of its
// own).
func tool(t testing.TB, name string) string {
	t.Helper()
	if name == "cnitool" {
		for _, p := range []string{os.Getenv("CNITOOL"), filepath.Join(os.Getenv("HOME"), ".cache/skein/tools/cni-v1.3.1/cnitool")} {
			if p != "" {
				if _, err := os.Stat(p); err == nil {
					return p
				}
			}
		}
	}
	return skeintest.RequireTool(t, name)
}

// run runs a command and returns its combined output, failing on error.
func run(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
