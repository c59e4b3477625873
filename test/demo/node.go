package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/netns"
)

// The node's own addresses, on its loopback, inside the demo's namespace
// only (documentation ranges).
var nodeAddrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("2001:db8::10/128")}

// The one pool everything shares: skeind's default pool.
const pool4, pool6 = "10.64.0.0/16", "fd00:64::/112"

// netName is the CNI network of the pods and the VM.
const netName = "demo"

// demo is one run: a node namespace, its skeind, and the members attached.
type demo struct {
	bin, vmMode string

	dir     string // temporary directory: skeind's state, dockerd's roots, the VM's files
	node    string // the node namespace's path
	sock    string // skeind's gRPC socket
	plugin  string // Docker driver name; "" when Docker is skipped
	cni     *libcni.CNIConfig
	members []*member
	skipped []string // what was left out, and why
}

// member is one attached workload.
type member struct {
	kind, name string
	v4, v6     netip.Addr
	hostLink   string // from skeind's attachment record
	pool       string // likewise
	detail     string
	// ping tries each address and reports which answered. nil: this
	// member cannot ping (it has no shell the demo can reach).
	ping func(ctx context.Context, to []netip.Addr) (map[netip.Addr]bool, error)
}

func (m *member) addrs() []netip.Addr {
	var out []netip.Addr
	for _, a := range []netip.Addr{m.v4, m.v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

func (d *demo) skip(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	d.skipped = append(d.skipped, s)
	fmt.Println("   SKIPPED:", s)
}

func (d *demo) run(ctx context.Context, c *cleanup) error {
	var err error
	if d.bin, err = filepath.Abs(d.bin); err != nil {
		return err
	}
	for _, b := range []string{"skeind", "skein", "skein-cni", "skein-vm", "skein-vmwrapper"} {
		if _, err := os.Stat(filepath.Join(d.bin, b)); err != nil {
			return fmt.Errorf("%s not found in %s (run make build): %w", b, d.bin, err)
		}
	}
	if _, err := exec.LookPath("ping"); err != nil {
		return fmt.Errorf("ping not found (scripts/install-deps.sh demo installs iputils-ping): %w", err)
	}
	if d.dir, err = os.MkdirTemp("", "skein-demo-"); err != nil {
		return err
	}
	c.add(d.removeDir)

	fmt.Println("== a node namespace, and skeind serving it with one dual-stack pool (" + pool4 + ", " + pool6 + ")")
	if d.node, err = newNS(c, "node"); err != nil {
		return err
	}
	if err := nodeAddresses(d.node); err != nil {
		return err
	}
	dockerWhy := dockerMissing()
	if dockerWhy == "" {
		d.plugin = "skein-demo-" + randHex(3)
	}
	if err := d.startSkeind(c); err != nil {
		return err
	}

	fmt.Println("\n== two pods through the skein CNI binary (libcni, as containerd and CRI-O call it)")
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": netName, "plugins": []any{
		map[string]any{"type": "skein", "socket": d.sock},
	}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return err
	}
	d.cni = libcni.NewCNIConfigWithCacheDir([]string{d.bin}, filepath.Join(d.dir, "cni-cache"), nil)
	for _, name := range []string{"pod1", "pod2"} {
		if err := d.addPod(ctx, c, list, name); err != nil {
			return err
		}
	}

	fmt.Println("\n== a Docker container through a real dockerd in the node namespace (skein's network and IPAM driver)")
	if dockerWhy != "" {
		d.skip("the Docker container: %s", dockerWhy)
	} else if err := d.addDocker(ctx, c); err != nil {
		return err
	}

	if err := d.addVM(ctx, c); err != nil {
		return err
	}

	if err := d.hostLinks(ctx); err != nil {
		return err
	}
	d.printTable()
	return d.pingMatrix(ctx)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// removeDir removes the demo's directory. Normally every process and
// mount in it is gone by then; if one is not (dockerd killed before it
// could stop its containerd and unmount its roots, e.g. by a Ctrl-C that
// arrived while it was starting), it says so, ends the processes (each
// has the directory in its command line, so each is the demo's), and
// unmounts what is left, deepest first.
func (d *demo) removeDir() error {
	var errs []error
	if left := leftoverProcesses(d.dir); len(left) > 0 {
		fmt.Printf("   ending %d process(es) the demo's dockerd or qemu left:\n     %s\n", len(left), strings.Join(left, "\n     "))
		killLeftovers(d.dir)
	}
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	var under []string
	for _, m := range mounts {
		if p := strings.Fields(m)[1]; strings.HasPrefix(p, d.dir+"/") {
			under = append(under, p)
		}
	}
	slices.SortFunc(under, func(a, b string) int { return len(b) - len(a) })
	for _, p := range under {
		fmt.Println("   unmounting", p, "(left by dockerd)")
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// newNS creates a pinned namespace with lo up; cleanup removes it.
func newNS(c *cleanup, name string) (string, error) {
	p := filepath.Join("/run/netns", "skein-demo-"+name+"-"+randHex(3))
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		return "", err
	}
	if err := netns.Create(p); err != nil {
		return "", err
	}
	c.add(func() error { return netns.Remove(p) })
	h, closeH, err := netns.Handle(p)
	if err != nil {
		return p, err
	}
	defer closeH()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	return p, err
}

func nodeAddresses(node string) error {
	h, closeH, err := netns.Handle(node)
	if err != nil {
		return err
	}
	defer closeH()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	for _, p := range nodeAddrs {
		pr := netlink.NewIPNet(p.Addr().AsSlice())
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: pr}); err != nil {
			return fmt.Errorf("node address %v: %w", p, err)
		}
	}
	return nil
}

// ownGroup keeps a child out of the terminal's process group, so Ctrl-C
// reaches the demo only and the demo stops its children in order.
func ownGroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// startSkeind runs skeind for the node namespace, its state, sockets and
// VM tokens in the demo's directory, the Docker plugin socket (if any)
// where dockerd discovers plugins.
func (d *demo) startSkeind(c *cleanup) error {
	d.sock = filepath.Join(d.dir, "skeind.sock")
	dockerSock := "off"
	if d.plugin != "" {
		dockerSock = filepath.Join(pluginDir, d.plugin+".sock")
		if err := mkdirOwned(c, pluginDir); err != nil {
			return err
		}
		c.add(func() error {
			if err := os.Remove(dockerSock); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		})
	}
	cmd := ownGroup(exec.Command(filepath.Join(d.bin, "skeind"), "--node-netns", d.node, "--state-dir", filepath.Join(d.dir, "state"),
		"--socket", d.sock, "--metrics-addr", "off", "--docker-socket", dockerSock,
		"--default-pool", pool4+","+pool6, "--node", "demo-node"))
	logf, err := os.Create(filepath.Join(d.dir, "skeind.log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start skeind: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	c.add(func() error {
		defer logf.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("skeind: %v; its log:\n%s", err, tailFile(logf.Name(), 20))
			}
			return nil
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			return errors.New("skeind did not exit within 20s of SIGTERM (killed)")
		}
	})
	c.add(func() error { return nodeClean(d.node) })
	for i := 0; i < 500; i++ {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("skeind exited at start: %v\n%s", err, tailFile(logf.Name(), 20))
		default:
		}
		if _, err := os.Stat(d.sock); err == nil {
			fmt.Printf("   skeind is serving on %s (state, logs and every other file of the demo in %s)\n", d.sock, d.dir)
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("skeind did not create its socket within 5s")
}

// mkdirOwned creates dir (and missing parents) unless it exists; cleanup
// removes what it created, if empty by then.
func mkdirOwned(c *cleanup, dir string) error {
	var made []string
	for p := dir; p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		made = append(made, p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.add(func() error {
		for _, p := range made {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove %s, which the demo created: %w", p, err)
			}
		}
		return nil
	})
	return nil
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), n)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// addPod attaches one pod (a namespace) through libcni.
func (d *demo) addPod(ctx context.Context, c *cleanup, list *libcni.NetworkConfigList, name string) error {
	ns, err := newNS(c, name)
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: "demo-" + name, NetNS: ns, IfName: "eth0"}
	start := time.Now()
	r, err := d.cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", name, err)
	}
	took := time.Since(start)
	c.add(func() error {
		if err := d.cni.DelNetworkList(context.Background(), list, rt); err != nil {
			return fmt.Errorf("DEL %s: %w", name, err)
		}
		fmt.Printf("   DEL %s ok\n", name)
		return nil
	})
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return err
	}
	m := &member{kind: "pod (CNI)", name: name, detail: "eth0 in its namespace", ping: nsPinger(ns)}
	m.v4, m.v6 = resultAddrs(res)
	fmt.Printf("   ADD %s ok in %v: %v %v\n", name, took.Round(100*time.Microsecond), m.v4, m.v6)
	d.members = append(d.members, m)
	return nil
}

// resultAddrs returns a CNI result's first address of each family.
func resultAddrs(r *current.Result) (v4, v6 netip.Addr) {
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		switch a = a.Unmap(); {
		case a.Is4() && !v4.IsValid():
			v4 = a
		case a.Is6() && !v6.IsValid():
			v6 = a
		}
	}
	return v4, v6
}

// nsPinger pings from inside a namespace with the ping binary, three
// tries per address (the first echo may wait on neighbour discovery).
func nsPinger(ns string) func(context.Context, []netip.Addr) (map[netip.Addr]bool, error) {
	return func(ctx context.Context, to []netip.Addr) (map[netip.Addr]bool, error) {
		ok := map[netip.Addr]bool{}
		for _, a := range to {
			for try := 0; try < 3 && !ok[a] && ctx.Err() == nil; try++ {
				err := netns.Do(ns, func() error {
					return exec.CommandContext(ctx, "ping", "-c", "1", "-W", "1", a.String()).Run()
				})
				ok[a] = err == nil
			}
		}
		return ok, ctx.Err()
	}
}

// hostLinks fills in each member's host link and pool from skeind's own
// records: the attachment holding the member's address.
func (d *demo) hostLinks(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+d.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := rpc.NewAdminClient(conn).ListAttachments(cctx, &rpc.AttachmentFilter{})
	if err != nil {
		return fmt.Errorf("list skeind's attachments: %w", err)
	}
	for _, m := range d.members {
		for _, a := range l.Attachments {
			for _, s := range a.Addresses {
				p, err := netip.ParsePrefix(s)
				if a.HostLink != "" && (err == nil && p.Addr() == m.v4 || s == m.v4.String()) {
					m.hostLink, m.pool = a.HostLink, a.Pool
				}
			}
		}
		if m.hostLink == "" {
			return fmt.Errorf("skeind has no attachment with %s's address %s", m.name, m.v4)
		}
	}
	return nil
}

// nodeClean checks that DEL left no link and no pod route in the node.
func nodeClean(node string) error {
	h, closeH, err := netns.Handle(node)
	if err != nil {
		return err
	}
	defer closeH()
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			return fmt.Errorf("link %s left in the node namespace", l.Attrs().Name)
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 116}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return err
	}
	if len(routes) > 0 {
		return fmt.Errorf("%d pod route(s) left in table 116", len(routes))
	}
	fmt.Println("   node namespace: no skein link or pod route left")
	return nil
}
