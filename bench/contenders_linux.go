package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// A contender attaches pods to a node of its own, one way.
type contender interface {
	Name() string
	// start makes the node namespace (and daemon); sc owns all of it.
	start(sc *scope)
	// add attaches pod's eth0 as attachment id; del removes it. Both are
	// safe for concurrent use and time exactly what a runtime waits for.
	add(id string, pod *harness.NS) error
	del(id string, pod *harness.NS) error
	node() *harness.NS
}

// daemonized is a contender whose work is partly done by daemons of its
// own (skeind), whose CPU time its cells count.
type daemonized interface {
	daemons() []int
}

// limited is a contender that cannot hold more than maxAttachments on
// one node network.
type limited interface {
	maxAttachments() (int, string)
}

// preloader is a contender with a faster way to put many attachments on
// its node than add (the kernel state it leaves is the same).
type preloader interface {
	preload(ids []string, pods []*harness.NS) error
}

// callTimeout bounds one libcni call.
const callTimeout = 60 * time.Second

// cniContender is any contender reached through libcni with a conflist;
// the plugins run inside the node namespace, where a runtime on that node
// would run them (bridge creates its bridge there).
type cniContender struct {
	name string
	n    *harness.NS
	list *libcni.NetworkConfigList
	cni  *libcni.CNIConfig
}

func (c *cniContender) Name() string      { return c.name }
func (c *cniContender) node() *harness.NS { return c.n }

func (c *cniContender) rt(id string, pod *harness.NS) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "eth0"}
}

func (c *cniContender) add(id string, pod *harness.NS) error {
	var callErr error
	if err := c.n.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, callErr = c.cni.AddNetworkList(ctx, c.list, c.rt(id, pod))
		return nil
	}); err != nil {
		return err
	}
	return callErr
}

func (c *cniContender) del(id string, pod *harness.NS) error {
	var callErr error
	if err := c.n.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		callErr = c.cni.DelNetworkList(ctx, c.list, c.rt(id, pod))
		return nil
	}); err != nil {
		return err
	}
	return callErr
}

func confList(sc *scope, name string, plugins ...map[string]any) *libcni.NetworkConfigList {
	// 1.0.0: the newest version Debian's reference plugins speak, so every
	// contender parses and prints the same result format.
	b, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": plugins})
	if err != nil {
		sc.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		sc.Fatalf("conflist %s: %v", name, err)
	}
	return l
}

// ranges is host-local's "ranges" for one /16 (and /108 with dual stack).
func ranges(v4, v6 string, dual bool) [][]map[string]string {
	r := [][]map[string]string{{{"subnet": v4}}}
	if dual {
		r = append(r, []map[string]string{{"subnet": v6}})
	}
	return r
}

func defaultRoutes(dual bool) []map[string]string {
	r := []map[string]string{{"dst": "0.0.0.0/0"}}
	if dual {
		r = append(r, map[string]string{"dst": "::/0"})
	}
	return r
}

// bridgeContender: the reference bridge plugin with host-local IPAM, the
// bridge as the pods' default gateway.
func bridgeContender(dual bool) contender {
	return &refContender{cniContender: cniContender{name: "bridge+host-local"}, conf: func(dataDir string) map[string]any {
		return map[string]any{"type": "bridge", "bridge": "benchbr0", "isGateway": true, "isDefaultGateway": true,
			"ipam": map[string]any{"type": "host-local", "dataDir": dataDir, "ranges": ranges("10.72.0.0/16", "fd00:72::/108", dual)}}
	}, limit: 1024, why: "a Linux bridge takes at most 1,024 ports (BR_MAX_PORTS; the plugin fails with EXFULL, \"exchange full\")"}
}

// ptpContender: the reference ptp plugin (routed veth, like skein) with
// host-local IPAM and default routes.
func ptpContender(dual bool) contender {
	return &refContender{limit: 1 << 30, cniContender: cniContender{name: "ptp+host-local"}, conf: func(dataDir string) map[string]any {
		return map[string]any{"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "dataDir": dataDir, "ranges": ranges("10.73.0.0/16", "fd00:73::/108", dual), "routes": defaultRoutes(dual)}}
	}}
}

type refContender struct {
	cniContender
	conf  func(dataDir string) map[string]any
	limit int
	why   string
}

func (c *refContender) maxAttachments() (int, string) { return c.limit, c.why }

func (c *refContender) start(sc *scope) {
	c.n = newNode(sc)
	c.list = confList(sc, "bench-"+c.name[:3], c.conf(sc.TempDir()))
	c.cni = libcni.NewCNIConfigWithCacheDir([]string{skeintest.RefPluginDir}, sc.TempDir(), nil)
}

// skeinContender: skeind on the node, the skein binary through libcni.
type skeinContender struct {
	cniContender
	dual bool
	d    *skeintest.Daemon
}

// newSkeinContender returns skein under name, with a dual-stack pool if
// dual.
func newSkeinContender(name string, dual bool) *skeinContender {
	return &skeinContender{cniContender: cniContender{name: name}, dual: dual}
}

func (c *skeinContender) start(sc *scope) {
	pool := []string{"10.64.0.0/14"}
	if c.dual {
		pool = append(pool, "fd00:64::/108")
	}
	// info: no per-request log lines in the measured path (debug has them),
	// but the startup reconcile's summary, which the restart reports.
	c.d = skeintest.StartDaemon(sc, skeintest.Options{Node: newNode(sc), DefaultPool: pool, Args: []string{"--log-level", "info"}})
	c.n = c.d.Node
	c.list = confList(sc, "bench-skein", map[string]any{"type": "skein", "socket": c.d.Socket})
	c.cni = libcni.NewCNIConfigWithCacheDir([]string{c.d.BinDir}, sc.TempDir(), nil)
}

// preload calls skeind's CNI service directly (no plugin exec: the same
// attachments, made faster), from two workers.
func (c *skeinContender) preload(ids []string, pods []*harness.NS) error {
	conn, err := grpc.NewClient("unix://"+c.d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cl := rpc.NewCNIClient(conn)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "bench-skein", "type": "skein"})
	return parallel(4, len(ids), func(i int) error {
		rep, err := cl.Add(context.Background(), &rpc.CNIRequest{ContainerId: ids[i], Netns: pods[i].Path(), Ifname: "eth0", Netconf: conf})
		if err == nil && rep.Error != nil {
			err = fmt.Errorf("code %d: %s", rep.Error.Code, rep.Error.Msg)
		}
		return err
	})
}

// floorContender: the kernel work of a routed-veth attachment through
// raw netlink in-process (bench/floor_linux.go) — no IPAM, store, IPC or
// process. Addresses come from a counter.
type floorContender struct {
	name string
	// podDel deletes the veth from the pod's end, inside the pod's
	// namespace (as bridge and ptp do), instead of from the node's end.
	podDel bool
	n      *harness.NS
	f      *Floor
	dual   bool
	next   atomic.Uint32
	mu     sync.Mutex
	names  map[string]string
}

func (c *floorContender) Name() string      { return c.name }
func (c *floorContender) node() *harness.NS { return c.n }

func (c *floorContender) start(sc *scope) {
	c.n = newNode(sc)
	f, closeF, err := NewFloor(c.n.Path())
	if err != nil {
		sc.Fatalf("floor: %v", err)
	}
	sc.Cleanup(closeF)
	c.f, c.names = f, map[string]string{}
}

func floorLink(id string) string {
	h := sha256.Sum256([]byte(id))
	return "fl" + hex.EncodeToString(h[:6])
}

func (c *floorContender) add(id string, pod *harness.NS) error {
	n := c.next.Add(1)
	addrs := []netip.Addr{netip.AddrFrom4([4]byte{10, 68 + byte(n>>16), byte(n >> 8), byte(n)})}
	if c.dual {
		addrs = append(addrs, netip.AddrFrom16([16]byte{0: 0xfd, 3: 0x68, 12: byte(n >> 24), 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)}))
	}
	return c.f.Setup(floorLink(id), pod.Path(), "eth0", addrs)
}

func (c *floorContender) del(id string, pod *harness.NS) error {
	if c.podDel {
		return c.f.TeardownInPod(pod.Path(), "eth0")
	}
	return c.f.Teardown(floorLink(id))
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(workers, n int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first error
		once  sync.Once
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// execFloorContender: bench/execfloor, a static Go binary that prints a
// canned result, through libcni from skein's binary directory and in the
// node namespace, as skein is run. It touches no kernel state, so the
// attachments "on its node" are none: its figures are the same at every
// level, measured at each one all the same.
type execFloorContender struct{ cniContender }

func (c *execFloorContender) start(sc *scope) {
	c.n = newNode(sc)
	c.list = confList(sc, "bench-execfloor", map[string]any{"type": "execfloor"})
	c.cni = libcni.NewCNIConfigWithCacheDir([]string{execFloorDir(sc)}, sc.TempDir(), nil)
}

// preload does nothing: the exec floor keeps no attachments.
func (c *execFloorContender) preload(ids []string, pods []*harness.NS) error { return nil }

// execFloorDir is the directory holding the execfloor binary: skein's
// binary directory when `make build` put it there, else a temporary one it
// is built into here, static and stripped as make builds.
func execFloorDir(sc *scope) string {
	dir := skeintest.Binaries(sc)
	if _, err := os.Stat(filepath.Join(dir, "execfloor")); err == nil {
		return dir
	}
	tmp := sc.TempDir()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp+"/", "./bench/execfloor")
	cmd.Dir = moduleDir(sc)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		sc.Fatalf("build execfloor: %v\n%s", err, out)
	}
	return tmp
}

// moduleDir is the root of the skein module this command was built from.
func moduleDir(sc *scope) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		sc.Fatalf("no execfloor in %s and not inside the skein module to build it (go env GOMOD: %v)", skeintest.Binaries(sc), err)
	}
	return filepath.Dir(mod)
}
