package main

// The Docker part: a real dockerd inside the node namespace, as
// test/docker's env does (its helpers are _test.go files, so the few
// steps needed are repeated here): its own data and exec roots, socket
// and pid file in the demo's directory, no default bridge, no iptables or
// forwarding changes; entered with setns (`ip netns exec` would remount
// /sys and hide the cgroups from it).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/tools"
)

// pluginDir is where dockerd discovers plugin sockets (not configurable).
const pluginDir = "/run/docker/plugins"

// image is the busybox image the engine gets (docker import; no registry).
const image = "skein/busybox"

// dockerCLI prefers a newer client in /usr/local/bin; both speak API 1.41.
func dockerCLI() string { return tools.DockerCLI() }

// dockerMissing says why the Docker part cannot run, or "".
func dockerMissing() string {
	for _, b := range []string{"dockerd", dockerCLI(), "containerd", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("%s is not installed (scripts/install-deps.sh demo installs docker.io)", b)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return "/bin/busybox is missing, the container image is built from it (apt-get install busybox-static)"
	}
	return ""
}

// dockerEngine is the demo's dockerd.
type dockerEngine struct {
	sock string
}

// docker runs the CLI against the demo's engine.
func (e *dockerEngine) docker(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, dockerCLI(), append([]string{"-H", "unix://" + e.sock}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *demo) addDocker(ctx context.Context, c *cleanup) error {
	e, err := d.startDockerd(ctx, c)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := e.importImage(ctx); err != nil {
		return err
	}
	fmt.Printf("   imported %s (busybox) in %v\n", image, time.Since(start).Round(time.Millisecond))

	// One network on skein's default pool, both families: no --subnet, so
	// skein's IPAM driver answers with the pool's subnets.
	if _, err := e.docker(ctx, "network", "create", "-d", d.plugin, "--ipam-driver", d.plugin, "--ipv6", netName); err != nil {
		return err
	}
	c.add(func() error {
		_, err := e.docker(context.Background(), "network", "rm", netName)
		return err
	})
	fmt.Printf("   docker network create -d %s --ipam-driver %s --ipv6 %s\n", d.plugin, d.plugin, netName)
	const name = "ctr1"
	c.add(func() error {
		// SIGKILL: busybox as PID 1 ignores SIGTERM.
		out, err := e.docker(context.Background(), "rm", "-f", name)
		if err != nil && strings.Contains(out, "No such container") {
			return nil // docker run failed before creating it
		}
		return err
	})
	start = time.Now()
	if _, err := e.docker(ctx, "run", "-d", "--name", name, "--net", netName, image, "sleep", "3600"); err != nil {
		return err
	}
	fmt.Printf("   docker run --net %s %s: running in %v\n", netName, name, time.Since(start).Round(time.Millisecond))

	out, err := e.docker(ctx, "inspect", "-f", "{{json .NetworkSettings.Networks}}", name)
	if err != nil {
		return err
	}
	var nets map[string]struct{ IPAddress, GlobalIPv6Address, EndpointID string }
	if err := json.Unmarshal([]byte(out), &nets); err != nil {
		return fmt.Errorf("docker inspect %s: %w", name, err)
	}
	n, ok := nets[netName]
	if !ok {
		return fmt.Errorf("docker inspect: %s is not on network %s: %s", name, netName, out)
	}
	m := &member{kind: "container (Docker)", name: name, detail: "eth0 in the container, endpoint " + shortID(n.EndpointID)}
	m.v4, _ = netip.ParseAddr(n.IPAddress)
	m.v6, _ = netip.ParseAddr(n.GlobalIPv6Address)
	m.ping = func(ctx context.Context, to []netip.Addr) (map[netip.Addr]bool, error) { return e.ping(ctx, name, to) }
	fmt.Printf("   %s: %v %v (docker inspect)\n", name, m.v4, m.v6)
	d.members = append(d.members, m)
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// startDockerd starts dockerd in the node namespace and waits until it
// answers; cleanup stops it (its roots go with the demo's directory).
func (d *demo) startDockerd(ctx context.Context, c *cleanup) (*dockerEngine, error) {
	dir := filepath.Join(d.dir, "docker")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	e := &dockerEngine{sock: filepath.Join(dir, "docker.sock")}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		return nil, err
	}
	cmd := ownGroup(exec.Command("dockerd", tools.DockerdArgs(dir, e.sock)...))
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := netns.Do(d.node, cmd.Start); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start dockerd in the node namespace: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	c.add(func() error {
		defer logf.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			fmt.Println("   dockerd stopped")
			return nil
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			return errors.New("dockerd did not exit within 30s of SIGTERM (killed)")
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			done <- err
			return nil, fmt.Errorf("dockerd exited at start (%v):\n%s", err, tailFile(logf.Name(), 20))
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		if v, err := e.docker(ctx, "version", "-f", "{{.Server.Version}}"); err == nil {
			fmt.Printf("   dockerd %s answering in %v (data and exec roots in %s)\n", v, time.Since(start).Round(time.Millisecond), dir)
			return e, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("dockerd did not answer within 60s:\n%s", tailFile(logf.Name(), 20))
}

// importImage gives the engine the busybox image (tools.LoadBusybox:
// /bin/busybox and one symlink per applet, PATH=/bin).
func (e *dockerEngine) importImage(ctx context.Context) error {
	bb, err := tools.LoadBusybox()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, dockerCLI(), "-H", "unix://"+e.sock, "import", "--change", "ENV PATH=/bin", "-", image)
	cmd.Stdin = bytes.NewReader(bb.Tar)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("docker import: %w\n%s", err, out)
	}
	return nil
}

// ping pings every address from inside the container with one docker
// exec (busybox ping, three tries each), as a user would.
func (e *dockerEngine) ping(ctx context.Context, ctr string, to []netip.Addr) (map[netip.Addr]bool, error) {
	var list []string
	for _, a := range to {
		list = append(list, a.String())
	}
	script := `for a in ` + strings.Join(list, " ") + `; do r=fail; for i in 1 2 3; do if ping -c 1 -W 1 $a >/dev/null 2>&1; then r=ok; break; fi; done; echo "$a $r"; done`
	out, err := e.docker(ctx, "exec", ctr, "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	return parsePingLines(out, ""), nil
}

// parsePingLines reads "ADDR ok|fail" lines (after prefix, if not empty).
func parsePingLines(out, prefix string) map[netip.Addr]bool {
	ok := map[netip.Addr]bool{}
	for _, line := range strings.Split(out, "\n") {
		if prefix != "" {
			i := strings.Index(line, prefix)
			if i < 0 {
				continue
			}
			line = line[i+len(prefix):]
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if a, err := netip.ParseAddr(f[0]); err == nil {
			ok[a] = f[1] == "ok"
		}
	}
	return ok
}
