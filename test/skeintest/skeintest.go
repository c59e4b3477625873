// Package skeintest runs the real skein binaries for privileged tests and
// benchmarks: it builds them once per test process, starts skeind for a
// "node" network namespace (harness.NS) with its own state directory and
// socket, and drives the CNI plugin through libcni exactly as a runtime
// does. Everything it starts is stopped at test cleanup.
package skeintest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
)

// RefPluginDir is where Debian's containernetworking-plugins installs the
// reference plugins.
const RefPluginDir = "/usr/lib/cni"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries returns a directory holding skein, skeind and skeinctl built from
// this checkout ($SKEIN_BIN_DIR if set, as `make` sets it).
func Binaries(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SKEIN_BIN_DIR"); d != "" {
		return d
	}
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		binDir, err = os.MkdirTemp("", "skein-bin-")
		if err != nil {
			buildErr = err
			return
		}
		// As `make build` builds them (static, faster to start; bin/skein
		// from C), by make itself.
		cmd := exec.Command("make", "--no-print-directory", "build", "BIN="+binDir)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	return binDir
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the skein module")
	}
	return filepath.Dir(mod), nil
}

// Options configures StartDaemon. Zero values are usable.
type Options struct {
	// Node is the namespace skeind manages; nil = a new one.
	Node *harness.NS
	// DefaultPool subnets; nil = 10.64.0.0/16 and fd00:64::/112. Empty
	// (non-nil) = no default pool.
	DefaultPool []string
	// Args are extra skeind flags.
	Args []string
}

// Daemon is a skeind process serving one node namespace.
type Daemon struct {
	Node   *harness.NS
	Dir    string
	Socket string
	BinDir string

	t       testing.TB
	args    []string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	done    chan struct{}
	exitErr error
}

// ExitErr is how the last process exited (nil: status 0); call it after
// Stop or Kill.
func (d *Daemon) ExitErr() error { <-d.done; return d.exitErr }

// StartDaemon starts skeind and waits until it answers.
func StartDaemon(t testing.TB, o Options) *Daemon {
	t.Helper()
	harness.RequireRoot(t)
	bin := Binaries(t)
	if o.Node == nil {
		o.Node = harness.NewNS(t, "node")
	}
	if o.DefaultPool == nil {
		o.DefaultPool = []string{"10.64.0.0/16", "fd00:64::/112"}
	}
	dir, err := os.MkdirTemp("", "skeind-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The pod networks' state directories are tmpfs mounts that
		// outlive skeind (see internal/kurma/sandbox).
		harness.UnmountUnder(dir)
		os.RemoveAll(dir)
	})
	d := &Daemon{Node: o.Node, Dir: dir, Socket: filepath.Join(dir, "skeind.sock"), BinDir: bin, t: t}
	d.args = []string{
		"--node-netns", o.Node.Path(),
		"--state-dir", filepath.Join(dir, "state"),
		"--socket", d.Socket,
		"--metrics-addr", "off",
		"--docker-socket", "off", // tests that want the Docker plugin pass their own (a later flag wins)
		"--node", "test-node",
		"--log-level", "debug",
	}
	if len(o.DefaultPool) > 0 {
		d.args = append(d.args, "--default-pool", strings.Join(o.DefaultPool, ","))
	}
	d.args = append(d.args, o.Args...)
	d.Start(t)
	t.Cleanup(func() {
		d.Stop(t)
		if t.Failed() {
			t.Logf("skeind log:\n%s", d.log.String())
		}
	})
	return d
}

// Start (re)starts the process with the same arguments. A --metrics-addr
// on loopback that another process took between the test choosing it and
// skeind binding it (the tests of other packages run beside) is chosen
// again, up to three times; MetricsAddr says where it ended.
func (d *Daemon) Start(t testing.TB) {
	t.Helper()
	for try := 1; ; try++ {
		exited := d.start(t)
		if !exited {
			return
		}
		if try < 3 && strings.Contains(d.log.String(), "address already in use") && d.rebindMetrics() {
			continue
		}
		t.Fatalf("skeind exited at start:\n%s", d.log.String())
	}
}

// start starts the process once and waits until it answers (false) or
// exits (true).
func (d *Daemon) start(t testing.TB) bool {
	t.Helper()
	d.log = &bytes.Buffer{}
	d.cmd = exec.Command(filepath.Join(d.BinDir, "skeind"), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start skeind: %v", err)
	}
	d.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { d.exitErr = c.Wait(); close(done) }(d.cmd, d.done)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			return true
		default:
		}
		if d.ping() == nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("skeind did not answer within 15s:\n%s", d.log.String())
	return false
}

// MetricsAddr is the last --metrics-addr skeind was started with.
func (d *Daemon) MetricsAddr() string {
	addr := ""
	for i := 0; i+1 < len(d.args); i++ {
		if d.args[i] == "--metrics-addr" {
			addr = d.args[i+1]
		}
	}
	return addr
}

// rebindMetrics gives the last --metrics-addr, if on 127.0.0.1, a port
// free now; false when there is none to change.
func (d *Daemon) rebindMetrics() bool {
	for i := len(d.args) - 2; i >= 0; i-- {
		if d.args[i] != "--metrics-addr" {
			continue
		}
		if !strings.HasPrefix(d.args[i+1], "127.0.0.1:") {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return false
		}
		d.args[i+1] = l.Addr().String()
		l.Close()
		return true
	}
	return false
}

// ping asks skeind for its status once.
func (d *Daemon) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = rpc.NewAdminClient(conn).Status(ctx, &rpc.Empty{})
	return err
}

// Stop sends SIGTERM and waits for the process to exit.
func (d *Daemon) Stop(t testing.TB) {
	d.signal(t, syscall.SIGTERM)
}

// Kill sends SIGKILL (a crash) and waits for the process to exit.
func (d *Daemon) Kill(t testing.TB) {
	d.signal(t, syscall.SIGKILL)
}

func (d *Daemon) signal(t testing.TB, sig syscall.Signal) {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Errorf("skeind did not exit on %v", sig)
	}
}

// Signal sends sig to the running skeind without waiting (SIGHUP: reload).
func (d *Daemon) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal skeind: %v", err)
	}
}

// OpenStore opens skeind's stores as skeind does (the durable file under
// its state directory, the CNI records' volatile file beside its socket);
// skeind must be stopped. The caller closes it.
func (d *Daemon) OpenStore(t testing.TB) store.Store {
	t.Helper()
	durable, err := store.OpenBolt(filepath.Join(d.Dir, "state", "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatalf("open skeind's store: %v", err)
	}
	// As daemon.Config.OpenTiered opens it (this package cannot import
	// the daemon: kurma's tests use both).
	st, err := store.OpenTiered(context.Background(), durable, store.TieredOptions{
		Path:       d.VolatileStore(),
		Volatile:   func(a store.Attachment) bool { return a.Owner == "cni" },
		CheckPools: true,
	})
	if err != nil {
		durable.Close()
		t.Fatalf("open skeind's volatile store: %v", err)
	}
	return st
}

// VolatileStore is where skeind keeps its CNI records: beside its socket
// (daemon.Config.VolatileStorePath).
func (d *Daemon) VolatileStore() string {
	return strings.TrimSuffix(d.Socket, ".sock") + "-attachments.db"
}

// Log returns what skeind has logged since its last start.
func (d *Daemon) Log() string { return d.log.String() }

// Admin returns a client of the Admin service, closed at cleanup.
func (d *Daemon) Admin(t testing.TB) rpc.AdminClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rpc.NewAdminClient(conn)
}

// Attachments lists every attachment skeind holds.
func (d *Daemon) Attachments(t testing.TB) []*rpc.Attachment {
	t.Helper()
	l, err := d.Admin(t).ListAttachments(context.Background(), &rpc.AttachmentFilter{})
	if err != nil {
		t.Fatalf("list attachments: %v", err)
	}
	return l.Attachments
}

// Plugin is one entry of a conflist.
type Plugin map[string]any

// SkeinPlugin returns a skein plugin entry pointing at this daemon, with
// extra fields merged in.
func (d *Daemon) SkeinPlugin(extra Plugin) Plugin {
	p := Plugin{"type": "skein", "socket": d.Socket}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// ConfList builds a network configuration list.
func ConfList(t testing.TB, name, version string, plugins ...Plugin) *libcni.NetworkConfigList {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cniVersion": version, "name": name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist: %v", err)
	}
	return list
}

// CNI returns a libcni runtime that finds skein and the reference plugins.
// It is safe for concurrent use.
func (d *Daemon) CNI() *libcni.CNIConfig {
	return NewCNI([]string{d.BinDir, RefPluginDir}, filepath.Join(d.Dir, "cni-cache"))
}

// NewCNI returns a libcni runtime searching path for plugins and caching
// results in cacheDir. Unlike libcni's constructors given a nil exec, it is
// safe for concurrent use: libcni creates a missing exec lazily, unguarded,
// on the first call.
func NewCNI(path []string, cacheDir string) *libcni.CNIConfig {
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return libcni.NewCNIConfigWithCacheDir(path, cacheDir, exec)
}

// RT is the runtime configuration for one attachment.
func RT(containerID, netnsPath, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: netnsPath, IfName: ifName}
}

// ErrCode returns the spec code of a plugin error (0 if err is nil or not
// a spec error). libcni wraps plugin errors; the code is found through
// the wrapping.
func ErrCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
