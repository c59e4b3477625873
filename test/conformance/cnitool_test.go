package conformance

import (
	"crypto/sha512"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/test/harness"
)

// cniResultsDir is where cnitool (libcni's default cache) keeps results;
// it is not configurable, so the suite removes what its networks left.
const cniResultsDir = "/var/lib/cni/results"

// cnitool runs the upstream cnitool against conflists in its own directory.
type cnitool struct {
	bin, confDir string
	env          []string
}

func newCnitool(t *testing.T, e *env) *cnitool {
	t.Helper()
	c := &cnitool{bin: tool(t, "cnitool"), confDir: t.TempDir()}
	c.env = []string{"NETCONFPATH=" + c.confDir, "CNI_PATH=" + e.d.BinDir}
	return c
}

// network writes a one-plugin skein conflist and registers the removal of
// cnitool's cached results for it.
func (c *cnitool) network(t *testing.T, e *env, name, version string) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[{"type":"skein","socket":%q}]}`, version, name, e.d.Socket)
	if version == noVersion {
		conf = fmt.Sprintf(`{"name":%q,"plugins":[{"type":"skein","socket":%q}]}`, name, e.d.Socket)
	}
	if err := os.WriteFile(filepath.Join(c.confDir, name+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		files, _ := filepath.Glob(filepath.Join(cniResultsDir, name+"-*"))
		for _, f := range files {
			os.Remove(f)
		}
	})
}

func (c *cnitool) run(verb, network string, ns *harness.NS) (string, error) {
	return runErr(c.env, c.bin, verb, network, ns.Path())
}

// containerID is the ID cnitool derives from the netns path.
func cnitoolID(nsPath string) string {
	s := sha512.Sum512([]byte(nsPath))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// TestCnitoolEveryVersion drives skein with the upstream cnitool in every
// spec version and without cniVersion: add (result shape of that version),
// check, status, del, del again; and gc, which must remove this network's
// attachments only.
func TestCnitoolEveryVersion(t *testing.T) {
	e := newEnv(t)
	ct := newCnitool(t, e)
	for _, v := range append(versions, noVersion) {
		t.Run(v, func(t *testing.T) {
			net := "ct-" + strings.ReplaceAll(v, ".", "") + "-" + harness.RandHex(4)
			ct.network(t, e, net, v)
			ns := harness.NewNS(t, "pod")
			out, err := ct.run("add", net, ns)
			if err != nil {
				t.Fatalf("cnitool add (cniVersion %s): %v\n%s", v, err, out)
			}
			for _, p := range shapeProblems([]byte(out), resultVersion(v), "eth0", ns.Path()) {
				violation(t, "the ADD result follows the Result type of cniVersion "+resultVersion(v), "%s\n  result: %s", p, out)
			}
			atts := e.d.Attachments(t)
			if len(atts) != 1 || atts[0].ContainerId != cnitoolID(ns.Path()) || atts[0].Network != net {
				t.Errorf("skeind should hold %s/%s/eth0 after cnitool add, holds: %s", net, cnitoolID(ns.Path()), keys(atts))
			}
			reach(t, ns, "pod attached by cnitool to its gateway", gw4)
			if v >= "0.4.0" && v != noVersion {
				if out, err := ct.run("check", net, ns); err != nil {
					violation(t, "CHECK succeeds for an attachment as ADD left it", "cnitool check: %v\n%s", err, out)
				}
			}
			if v >= "1.1.0" && v != noVersion {
				if out, err := ct.run("status", net, ns); err != nil {
					violation(t, "STATUS succeeds when the plugin is ready", "cnitool status: %v\n%s", err, out)
				}
			}
			if out, err := ct.run("del", net, ns); err != nil {
				violation(t, "DEL succeeds", "cnitool del: %v\n%s", err, out)
			}
			if out, err := ct.run("del", net, ns); err != nil {
				violation(t, "DEL of something already gone succeeds", "second cnitool del: %v\n%s", err, out)
			}
			e.assertClean(t, "cnitool del")
		})
	}

	t.Run("gc", func(t *testing.T) {
		sfx := harness.RandHex(4)
		net, other := "ct-gc-"+sfx, "ct-keep-"+sfx
		ct.network(t, e, net, "1.1.0")
		ct.network(t, e, other, "1.1.0")
		a, b, c := harness.NewNS(t, "pod"), harness.NewNS(t, "pod"), harness.NewNS(t, "pod")
		for _, x := range []struct {
			net string
			ns  *harness.NS
		}{{net, a}, {net, b}, {other, c}} {
			if out, err := ct.run("add", x.net, x.ns); err != nil {
				t.Fatalf("cnitool add %s: %v\n%s", x.net, err, out)
			}
		}
		// cnitool gc lists no valid attachment: everything of net goes.
		if out, err := ct.run("gc", net, a); err != nil {
			violation(t, "GC succeeds", "cnitool gc: %v\n%s", err, out)
		}
		if got, want := keys(e.d.Attachments(t)), other+"/"+cnitoolID(c.Path())+"/eth0"; got != want {
			violation(t, "GC removes the network's attachments not listed as valid, and nothing of other networks",
				"after cnitool gc %s skeind holds [%s], want [%s]", net, got, want)
		}
		for _, ns := range []*harness.NS{a, b} {
			if _, err := ns.Handle(t).LinkByName("eth0"); err == nil {
				violation(t, "GC releases the resources of stale attachments", "eth0 is still in %s after GC", ns.Name())
			}
		}
		if out, err := ct.run("del", other, c); err != nil {
			violation(t, "DEL succeeds", "cnitool del: %v\n%s", err, out)
		}
		e.assertClean(t, "cnitool gc and del")
	})
}
