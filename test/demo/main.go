// Command demo is `make demo`: it starts skeind for a throwaway "node"
// namespace, attaches three "pods" (namespaces) through the real skein CNI
// binary driven by libcni, prints what they got, proves reachability with
// ping in both families, then detaches and removes everything.
//
// Usage (as root): demo -bin DIR   (DIR holds skein and skeind)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
)

// The node's own addresses, on its loopback, inside the demo's namespace
// only (documentation ranges).
var nodeAddrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("2001:db8::10/128")}

// cleanup runs undo steps in reverse; failed counts the ones that failed.
type cleanup struct {
	steps  []func() error
	failed int
}

func (c *cleanup) add(f func() error) { c.steps = append(c.steps, f) }
func (c *cleanup) run() {
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](); err != nil {
			fmt.Fprintln(os.Stderr, "   cleanup:", err)
			c.failed++
		}
	}
}

func main() {
	bin := flag.String("bin", "bin", "directory holding the skein and skeind binaries")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: run as root (it creates network namespaces)")
		os.Exit(1)
	}
	var c cleanup
	err := run(*bin, &c)
	fmt.Println("\n== cleaning up")
	c.run()
	if err == nil && c.failed > 0 {
		err = fmt.Errorf("%d cleanup step(s) failed", c.failed)
	}
	if err == nil {
		err = verifyGone()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
	fmt.Println("== done: no namespace, link, route, rule or file left behind")
}

var created []string // namespace paths, for verifyGone

func newNS(c *cleanup, name string) (string, error) {
	var r [3]byte
	_, _ = rand.Read(r[:])
	p := filepath.Join("/run/netns", "skein-demo-"+name+"-"+hex.EncodeToString(r[:]))
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		return "", err
	}
	if err := netns.Create(p); err != nil {
		return "", err
	}
	created = append(created, p)
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

func run(bin string, c *cleanup) error {
	bin, _ = filepath.Abs(bin)
	dir, err := os.MkdirTemp("", "skein-demo-")
	if err != nil {
		return err
	}
	created = append(created, dir)
	c.add(func() error { return os.RemoveAll(dir) })

	fmt.Println("== creating a node namespace and starting skeind on it")
	node, err := newNS(c, "node")
	if err != nil {
		return err
	}
	if err := nodeAddresses(node); err != nil {
		return err
	}
	sock := filepath.Join(dir, "skeind.sock")
	d := exec.Command(filepath.Join(bin, "skeind"), "--node-netns", node, "--state-dir", filepath.Join(dir, "state"),
		"--socket", sock, "--metrics-addr", "off", "--docker-socket", "off", "--default-pool", "10.64.0.0/16,fd00:64::/112", "--node", "demo-node")
	logf, err := os.Create(filepath.Join(dir, "skeind.log"))
	if err != nil {
		return err
	}
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		return fmt.Errorf("start skeind: %w", err)
	}
	c.add(func() error {
		d.Process.Signal(syscall.SIGTERM)
		err := d.Wait()
		logf.Close()
		if err != nil {
			return fmt.Errorf("skeind: %v", err)
		}
		return nil
	})
	c.add(func() error { return nodeClean(node) })
	if err := waitSocket(sock); err != nil {
		return err
	}
	fmt.Printf("   skeind is serving on %s (state in %s)\n", sock, dir)

	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "demo", "plugins": []any{
		map[string]any{"type": "skein", "socket": sock},
	}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cni-cache"), nil)
	ctx := context.Background()

	fmt.Println("== attaching three pods through the skein CNI binary (libcni, as containerd does)")
	type pod struct {
		name, ns string
		res      *current.Result
	}
	var pods []*pod
	for i := 1; i <= 3; i++ {
		p := &pod{name: fmt.Sprintf("pod%d", i)}
		if p.ns, err = newNS(c, p.name); err != nil {
			return err
		}
		rt := &libcni.RuntimeConf{ContainerID: "demo-" + p.name, NetNS: p.ns, IfName: "eth0"}
		start := time.Now()
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return fmt.Errorf("ADD %s: %w", p.name, err)
		}
		took := time.Since(start)
		c.add(func() error {
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				return fmt.Errorf("DEL %s: %w", p.name, err)
			}
			fmt.Printf("   DEL %s ok\n", p.name)
			return nil
		})
		if p.res, err = current.NewResultFromResult(r); err != nil {
			return err
		}
		fmt.Printf("   ADD %s ok in %v\n", p.name, took.Round(100*time.Microsecond))
		pods = append(pods, p)
	}

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "POD\tINTERFACE\tIPV4\tIPV6\tHOST LINK\tPOOL")
	addrOf := func(r *current.Result, v6 bool) netip.Addr {
		for _, ip := range r.IPs {
			a, _ := netip.AddrFromSlice(ip.Address.IP)
			if a = a.Unmap(); a.Is6() == v6 {
				return a
			}
		}
		return netip.Addr{}
	}
	for _, p := range pods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.name, p.res.Interfaces[1].Name, addrOf(p.res, false), addrOf(p.res, true), p.res.Interfaces[0].Name, "default")
	}
	tw.Flush()

	fmt.Println("\n== reachability (ping)")
	for i, from := range pods {
		to := pods[(i+1)%len(pods)]
		for _, v6 := range []bool{false, true} {
			if err := ping(from.ns, addrOf(to.res, v6)); err != nil {
				return fmt.Errorf("%s -> %s: %w", from.name, to.name, err)
			}
			fmt.Printf("   %s -> %s (%s) ok\n", from.name, to.name, addrOf(to.res, v6))
		}
	}
	for _, na := range nodeAddrs {
		if err := ping(pods[0].ns, na.Addr()); err != nil {
			return fmt.Errorf("pod1 -> node: %w", err)
		}
		fmt.Printf("   pod1 -> node (%s) ok\n", na.Addr())
	}
	return nil
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

func waitSocket(sock string) error {
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("skeind did not create its socket within 5s")
}

func ping(from string, to netip.Addr) error {
	args := []string{"-c", "1", "-W", "2", to.String()}
	if to.Is6() {
		args = append([]string{"-6"}, args...)
	}
	return netns.Do(from, func() error {
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s: %v: %s", to, err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}

// verifyGone checks that every namespace and directory the demo made is gone.
func verifyGone() error {
	for _, p := range created {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s is still there", p)
		}
	}
	return nil
}
