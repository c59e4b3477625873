package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cnirun"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// BenchmarkADDParts takes one skein ADD (c=1, a nearly empty node) apart,
// each part measured in the same loop, one after the other, each ADD on a
// fresh pod namespace, so that a change can be judged by the part it
// touches rather than by the whole, which the machine's noise swamps:
//
//   - floor: the kernel work alone (raw netlink, in-process);
//
//   - dataplane: internal/dataplane's Setup in-process, as skeind runs it;
//
//   - call: the request the skein binary sends skeind (package cnirun)
//     for an ADD, sent from this process, no exec — the call and all of
//     skeind's work;
//
//   - call-grpc: skeind's CNI Add over gRPC on a new connection (what a
//     binary of a skein release before package cnirun pays);
//
//   - noop-call: the same request for a service skeind does not have —
//     connection, checks and a spec error without skeind's work
//     (noop-call-grpc: a method it lacks, over gRPC);
//
//   - exec: the skein binary exec'd directly with the CNI environment, no
//     libcni;
//
//   - exec-version: the same for VERSION (no call): the binary's start,
//     stdin and exit without the call;
//
//   - exec-floor-direct: bench/execfloor exec'd directly, no libcni: what
//     any Go process costs to start and end;
//
//   - exec-floor-c-direct: the same in C (bench/execfloor-c, built with cc
//     when there is one): what a static C process costs, which bin/skein
//     is;
//
//   - libcni: skein through libcni, as skein-bench measures it;
//
//   - exec-floor: bench/execfloor through libcni.
//
// and the CPU time of the exec'd binaries (-cpu-p50-ms): the skein binary's
// ADD, DEL (exec-del) and VERSION (which the C binary hands to skein-cni,
// so it is two execs), and the exec floors'.
//
//	go test -run '^$' -bench ADDParts -benchtime 200x ./bench/
func BenchmarkADDParts(b *testing.B) {
	harness.RequireRoot(b)
	sc := newScope("parts", false)
	defer sc.close()
	node := newNode(sc)
	d := skeintest.StartDaemon(b, skeintest.Options{Node: node, DefaultPool: []string{"10.64.0.0/14"}, Args: []string{"--log-level", "info"}})
	f, closeF, err := NewFloor(node.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer closeF()
	dp, err := dataplane.New(dataplane.Config{NodeNetNS: node.Path()})
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	list := confList(sc, "parts", map[string]any{"type": "skein", "socket": d.Socket})
	cni := libcni.NewCNIConfigWithCacheDir([]string{d.BinDir}, b.TempDir(), nil)
	efList := confList(sc, "parts-ef", map[string]any{"type": "execfloor"})
	efDir := execFloorDir(sc)
	// The exec floor in C (bin/skein is a static C program too), when a
	// C compiler is here: exec-floor-c-direct.
	efcDir := b.TempDir()
	if out, err := exec.Command("cc", "-O2", "-static", "-o", filepath.Join(efcDir, "execfloor"), filepath.Join(moduleDir(sc), "bench/execfloor-c/execfloor.c")).CombinedOutput(); err != nil {
		b.Logf("no exec-floor-c-direct: cc: %v %s", err, out)
		efcDir = ""
	}
	efCNI := libcni.NewCNIConfigWithCacheDir([]string{efDir}, b.TempDir(), nil)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "parts", "type": "skein", "socket": d.Socket})
	ctx := context.Background()

	lat := map[string][]time.Duration{}
	timed := func(part string, fn func() error) {
		t := time.Now()
		err := fn()
		lat[part] = append(lat[part], time.Since(t))
		if err != nil {
			b.Fatalf("%s: %v", part, err)
		}
	}
	runCall := func(service, verb, id string, pod *harness.NS) (cnirun.Reply, error) {
		c, err := net.Dial("unix", d.Socket)
		if err != nil {
			return cnirun.Reply{}, err
		}
		defer c.Close()
		env := []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + pod.Path(), "CNI_IFNAME=eth0", "CNI_PATH=" + d.BinDir}
		if _, err := c.Write(cnirun.AppendRequest(nil, cnirun.Request{TimeoutMS: 60000, Service: service, Env: env, Stdin: conf})); err != nil {
			return cnirun.Reply{}, err
		}
		out, err := io.ReadAll(c)
		if err != nil {
			return cnirun.Reply{}, err
		}
		return cnirun.ParseReply(out)
	}
	call := func(verb, id string, pod *harness.NS) error {
		rep, err := runCall("skein.v1.CNI", verb, id, pod)
		if err == nil && rep.Exit != 0 {
			err = fmt.Errorf("exit %d: %s", rep.Exit, rep.Stdout)
		}
		return err
	}
	grpcCall := func(service, method, id string, pod *harness.NS) error {
		conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		rep := new(rpc.CNIReply)
		err = conn.Invoke(ctx, "/"+service+"/"+method, &rpc.CNIRequest{ContainerId: id, Netns: pod.Path(), Ifname: "eth0", Netconf: conf}, rep)
		if err == nil && rep.Error != nil {
			err = fmt.Errorf("%s", rep.Error.Msg)
		}
		return err
	}
	// cpu: the CPU time (user + system) of each exec'd binary, by part.
	cpu := map[string][]time.Duration{}
	// execIn runs bin (a path) for verb; the exec floors are named
	// execfloor, whatever directory holds them (bin/ holds skein's too).
	execIn := func(part, bin, verb, id string, pod *harness.NS) error {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + pod.Path(), "CNI_IFNAME=eth0", "CNI_PATH=" + d.BinDir}
		cmd.Stdin = bytes.NewReader(conf)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu[part] = append(cpu[part], time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
		}
		return nil
	}
	execSkein := func(part, verb, id string, pod *harness.NS) error {
		return execIn(part, filepath.Join(d.BinDir, "skein"), verb, id, pod)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ps := newPods(sc, 4)
		b.StartTimer()
		floor := func() {
			host := fmt.Sprintf("fl%d", i)
			timed("floor", func() error {
				return f.Setup(host, ps[0].Path(), "eth0", []netip.Addr{netip.AddrFrom4([4]byte{10, 68, byte(i >> 8), byte(i)})})
			})
			_ = f.Teardown(host)
		}
		inProcess := func() {
			dl := dataplane.Link{HostName: fmt.Sprintf("dp%d", i), Alias: "skein:parts", NetNS: ps[0].Path(), IfName: "eth1",
				Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 69, byte(i >> 8), byte(i)})}}
			timed("dataplane", func() error { _, err := dp.Setup(dl); return err })
			_ = dp.Teardown(dl.HostName, "", "", nil)
		}
		// Whichever runs second runs in the wake of the first one's veth
		// delete (the kernel's clean-up of a deleted device outlasts the
		// call) and takes ~0.3 ms longer here: they take turns.
		if i%2 == 0 {
			floor()
			inProcess()
		} else {
			inProcess()
			floor()
		}
		id := fmt.Sprintf("call%d", i)
		timed("call", func() error { return call("ADD", id, ps[1]) })
		_ = call("DEL", id, ps[1])
		id = fmt.Sprintf("callg%d", i)
		timed("call-grpc", func() error { return grpcCall("skein.v1.CNI", "Add", id, ps[1]) })
		_ = call("DEL", id, ps[1])
		timed("noop-call", func() error {
			if rep, err := runCall("skein.v1.Nothing", "ADD", id, ps[1]); err != nil || rep.Exit == 0 {
				return fmt.Errorf("an unknown service answered: %+v, %v", rep, err)
			}
			return nil
		})
		timed("noop-call-grpc", func() error {
			if err := grpcCall("skein.v1.Nothing", "Add", id, ps[1]); status.Code(err) != codes.Unimplemented {
				return fmt.Errorf("an unknown service answered: %v", err)
			}
			return nil
		})
		id = fmt.Sprintf("exec%d", i)
		timed("exec", func() error { return execSkein("exec", "ADD", id, ps[2]) })
		_ = execSkein("exec-del", "DEL", id, ps[2])
		timed("exec-version", func() error { return execSkein("exec-version", "VERSION", id, ps[2]) })
		timed("exec-floor-direct", func() error { return execIn("exec-floor-direct", filepath.Join(efDir, "execfloor"), "ADD", id, ps[2]) })
		if efcDir != "" {
			timed("exec-floor-c-direct", func() error {
				return execIn("exec-floor-c-direct", filepath.Join(efcDir, "execfloor"), "ADD", id, ps[2])
			})
		}
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("cni%d", i), NetNS: ps[3].Path(), IfName: "eth0"}
		timed("libcni", func() error {
			var err error
			_ = node.Do(func() error { _, err = cni.AddNetworkList(ctx, list, rt); return nil })
			return err
		})
		_ = node.Do(func() error { return cni.DelNetworkList(ctx, list, rt) })
		timed("exec-floor", func() error {
			var err error
			_ = node.Do(func() error { _, err = efCNI.AddNetworkList(ctx, efList, rt); return nil })
			return err
		})
		_ = node.Do(func() error { return efCNI.DelNetworkList(ctx, efList, rt) })
		b.StopTimer()
		removePods(ps)
		b.StartTimer()
	}
	b.StopTimer()
	for _, part := range []string{"floor", "dataplane", "call", "call-grpc", "noop-call", "noop-call-grpc", "exec", "exec-version", "exec-floor-direct", "exec-floor-c-direct", "libcni", "exec-floor"} {
		l := lat[part]
		if len(l) == 0 {
			continue // exec-floor-c-direct without a C compiler
		}
		slices.Sort(l)
		b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, part+"-p50-ms")
	}
	for _, part := range []string{"exec", "exec-del", "exec-version", "exec-floor-direct", "exec-floor-c-direct"} {
		if l := cpu[part]; len(l) > 0 {
			slices.Sort(l)
			b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, part+"-cpu-p50-ms")
		}
	}
}
