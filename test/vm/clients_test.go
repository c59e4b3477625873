package vm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// Each client runs with a script of ours that configures the interface
// with ip(8) and records the options it got in DIR/<event>.env — never the
// distribution's script, which would rewrite the host's /etc/resolv.conf.

// udhcpcScript configures from udhcpc's environment: option 121
// ("staticroutes": dst gw pairs, gw 0.0.0.0 = on-link) when present, else
// option 3.
const udhcpcScript = `#!/bin/sh
dir=%q
event=$1
case "$event" in
deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
bound|renew)
	env | sort > "$dir/$event.env"
	ip addr replace "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
	if [ -n "$staticroutes" ]; then
		set -- $staticroutes
		while [ $# -ge 2 ]; do
			if [ "$2" = 0.0.0.0 ]; then ip route replace "$1" dev "$interface"
			else ip route replace "$1" via "$2" dev "$interface"; fi
			shift 2
		done
	elif [ -n "$router" ]; then
		ip route replace default via "${router%%%% *}" dev "$interface"
	fi ;;
esac
echo "$event" >> "$dir/events" # last: the test waits for it
exit 0
`

// dhclientScript does the same from dhclient's new_* variables.
const dhclientScript = `#!/bin/sh
dir=%q
case "$reason" in
PREINIT) ip link set "$interface" up ;;
BOUND|RENEW|REBIND|REBOOT)
	env | sort > "$dir/$reason.env"
	bits=$(echo "$new_subnet_mask" | awk -F. '{n=0; for(i=1;i<=4;i++){x=$i; while(x>0){n+=x%%2; x=int(x/2)}} print n}')
	ip addr replace "$new_ip_address/$bits" dev "$interface"
	[ -n "$new_interface_mtu" ] && ip link set dev "$interface" mtu "$new_interface_mtu"
	if [ -n "$new_rfc3442_classless_static_routes" ]; then
		set -- $new_rfc3442_classless_static_routes
		while [ $# -gt 0 ]; do
			len=$1; shift; n=$(( (len + 7) / 8 )); dst=""; i=0
			while [ $i -lt 4 ]; do
				if [ $i -lt $n ]; then o=$1; shift; else o=0; fi
				dst="$dst${dst:+.}$o"; i=$((i+1))
			done
			gw="$1.$2.$3.$4"; shift 4
			if [ "$gw" = 0.0.0.0 ]; then ip route replace "$dst/$len" dev "$interface"
			else ip route replace "$dst/$len" via "$gw" dev "$interface"; fi
		done
	elif [ -n "$new_routers" ]; then
		ip route replace default via "${new_routers%%%% *}" dev "$interface"
	fi ;;
RELEASE|EXPIRE|STOP) ip -4 addr flush dev "$interface" ;;
esac
echo "$reason" >> "$dir/events" # last: the test waits for it
exit 0
`

// dhclientConf declares option 121 (dhclient does not know it by name)
// and asks for everything skein-vm serves.
const dhclientConf = `option rfc3442-classless-static-routes code 121 = array of unsigned integer 8;
request subnet-mask, routers, rfc3442-classless-static-routes, domain-name-servers,
	domain-name, domain-search, host-name, interface-mtu;
`

// dhcpcdScript only records: dhcpcd configures addresses and routes itself.
const dhcpcdScript = `#!/bin/sh
dir=%q
case "$reason" in BOUND|RENEW|REBIND|REBOOT) env | sort > "$dir/$reason.env" ;; esac
echo "$reason" >> "$dir/events"
exit 0
`

const dhcpcdConf = `noipv4ll
noipv6
noarp
nohook resolv.conf
option classless_static_routes, domain_name_servers, domain_name, domain_search, host_name, interface_mtu
`

// readEnv reads KEY=VALUE lines a script recorded.
func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the client's script recorded nothing: %v", err)
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = strings.Trim(v, "'")
		}
	}
	return m
}

// words splits a list the way clients print it (spaces, quotes, trailing
// dots of domain names dropped).
func words(s string) []string {
	var out []string
	for _, w := range strings.Fields(strings.NewReplacer(`"`, " ", `\`, " ").Replace(s)) {
		out = append(out, strings.TrimSuffix(w, "."))
	}
	return out
}

// checkOptions compares what a client's script saw with the CNI result's
// DNS, the pod name and the MTU.
func checkOptions(t *testing.T, client string, env map[string]string, dns, search, domain, host, mtu string) {
	t.Helper()
	wantDNS := testDNS["nameservers"].([]string)
	wantSearch := testDNS["search"].([]string)
	if got := words(env[dns]); !slices.Equal(got, wantDNS) {
		t.Errorf("%s: DNS servers %v, the CNI result has %v", client, got, wantDNS)
	}
	if got := words(env[search]); !slices.Equal(got, wantSearch) {
		t.Errorf("%s: search list %v, the CNI result has %v (option 119)", client, got, wantSearch)
	}
	if got := env[domain]; got != testDNS["domain"] {
		t.Errorf("%s: domain %q, the CNI result has %q", client, got, testDNS["domain"])
	}
	if got := env[host]; got != "web-0" {
		t.Errorf("%s: host name %q, want the pod name web-0 (CNI_ARGS K8S_POD_NAME)", client, got)
	}
	if got := env[mtu]; got != fmt.Sprint(podMTU) {
		t.Errorf("%s: MTU option %q, want %d", client, got, podMTU)
	}
}

func waitEvent(t *testing.T, dir, event string, timeout time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "events"))
		if slices.Contains(strings.Fields(string(b)), event) {
			return true
		}
	}
	return false
}

// startIn starts a long-running command inside ns; it is killed at cleanup.
func startIn(t *testing.T, ns *harness.NS, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return cmd
}

// TestUdhcpc: busybox udhcpc gets the lease and configures exactly the
// CNI result; a renewal (SIGUSR1: unicast to the server identifier, i.e.
// through the bridge towards the gateway's MAC) is answered; a release
// frees nothing in IPAM and the next client gets the same address.
func TestUdhcpc(t *testing.T) {
	skeintest.RequireTool(t, "udhcpc")
	e := newEnv(t)
	l := e.skeinChain(t, "vm-udhcpc", "1.1.0", nil)
	p := e.mustAddVM(t, l, "udhcpc", [2]string{"K8S_POD_NAME", "web-0"})
	vm, ifName := p.vmSide(t)
	dir, script := clientScript(t, udhcpcScript)
	used := e.poolUsed(t)

	cmd := startIn(t, vm, "udhcpc", "-f", "-i", ifName, "-s", script, "-t", "10", "-T", "1", "-A", "1")
	if !waitEvent(t, dir, "bound", 15*time.Second) {
		t.Fatal("udhcpc got no lease within 15s")
	}
	if got, want := readConfigured(t, vm, ifName), p.wantConfigured(); got.String() != want.String() {
		t.Errorf("udhcpc configured %s, the CNI result says %s", got, want)
	}
	checkOptions(t, "udhcpc", readEnv(t, filepath.Join(dir, "bound.env")), "dns", "search", "domain", "hostname", "mtu")
	if err := harness.Ping(t, vm, p.gw4); err != nil {
		t.Errorf("the VM side should reach its gateway %s through the bridge and the pod's veth: %v", p.gw4, err)
	}

	_ = cmd.Process.Signal(syscall.SIGUSR1)
	if !waitEvent(t, dir, "renew", 10*time.Second) {
		t.Error("udhcpc's renewal (SIGUSR1, unicast to the server identifier) got no answer within 10s")
	}
	_ = cmd.Process.Signal(syscall.SIGUSR2) // release
	if !waitEvent(t, dir, "deconfig", 5*time.Second) {
		t.Error("udhcpc did not release on SIGUSR2")
	}
	time.Sleep(200 * time.Millisecond) // let the RELEASE reach the server
	if got := e.poolUsed(t); got != used {
		t.Errorf("a DHCP release must not touch IPAM: the pool held %d addresses, now %d", used, got)
	}
	out, err := run(t, vm, 20*time.Second, "udhcpc", "-f", "-q", "-n", "-i", ifName, "-s", script, "-t", "10", "-T", "1")
	if err != nil {
		t.Fatalf("udhcpc after release: %v\n%s", err, out)
	}
	if got := readEnv(t, filepath.Join(dir, "bound.env"))["ip"]; got != p.addr4.Addr().String() {
		t.Errorf("after a release the VM should get the same address %s, got %s", p.addr4.Addr(), got)
	}
}

// TestDhclient: ISC dhclient with a 10 s lease: the lease, what it
// configures, its own renewal at T1 (5 s, unicast), release.
func TestDhclient(t *testing.T) {
	skeintest.RequireTool(t, "dhclient")
	e := newEnv(t)
	l := e.skeinChain(t, "vm-dhclient", "1.0.0", map[string]any{"leaseSeconds": 10})
	p := e.mustAddVM(t, l, "dhclient", [2]string{"K8S_POD_NAME", "web-0"})
	vm, ifName := p.vmSide(t)
	dir, script := clientScript(t, dhclientScript)
	conf := filepath.Join(dir, "dhclient.conf")
	if err := os.WriteFile(conf, []byte(dhclientConf), 0o644); err != nil {
		t.Fatal(err)
	}
	used := e.poolUsed(t)
	common := []string{"-4", "-sf", script, "-cf", conf, "-lf", filepath.Join(dir, "leases"), "-pf", filepath.Join(dir, "pid")}
	stop := func() {
		_, _ = run(t, vm, 10*time.Second, "dhclient", append(append([]string{"-x"}, common...), ifName)...)
	}
	t.Cleanup(stop)

	out, err := run(t, vm, 30*time.Second, "dhclient", append(append([]string{"-1"}, common...), ifName)...)
	if err != nil || !waitEvent(t, dir, "BOUND", time.Second) {
		t.Fatalf("dhclient got no lease: %v\n%s", err, out)
	}
	if got, want := readConfigured(t, vm, ifName), p.wantConfigured(); got.String() != want.String() {
		t.Errorf("dhclient configured %s, the CNI result says %s", got, want)
	}
	checkOptions(t, "dhclient", readEnv(t, filepath.Join(dir, "BOUND.env")),
		"new_domain_name_servers", "new_domain_search", "new_domain_name", "new_host_name", "new_interface_mtu")
	if !waitEvent(t, dir, "RENEW", 12*time.Second) {
		t.Error("dhclient's renewal at T1 (unicast to the server identifier) got no answer")
	}
	out, err = run(t, vm, 15*time.Second, "dhclient", append(append([]string{"-r"}, common...), ifName)...)
	if err != nil {
		t.Errorf("dhclient -r: %v\n%s", err, out)
	}
	if got := e.poolUsed(t); got != used {
		t.Errorf("a DHCP release must not touch IPAM: the pool held %d addresses, now %d", used, got)
	}
}

// TestDhcpcd: dhcpcd configures the interface itself (address, routes
// from option 121, MTU); its hook records the rest.
func TestDhcpcd(t *testing.T) {
	skeintest.RequireTool(t, "dhcpcd")
	e := newEnv(t)
	l := e.skeinChain(t, "vm-dhcpcd", "0.4.0", nil)
	p := e.mustAddVM(t, l, "dhcpcd", [2]string{"K8S_POD_NAME", "web-0"})
	vm, ifName := p.vmSide(t)
	dir, script := clientScript(t, dhcpcdScript)
	conf := filepath.Join(dir, "dhcpcd.conf")
	if err := os.WriteFile(conf, []byte(dhcpcdConf), 0o644); err != nil {
		t.Fatal(err)
	}
	// dhcpcd keeps leases in /var/lib/dhcpcd/<ifname>.lease, shared by all
	// namespaces; the interface name is unique to this test.
	t.Cleanup(func() {
		for _, g := range []string{"/var/lib/dhcpcd/" + ifName + "*", "/run/dhcpcd/" + ifName + "*"} {
			m, _ := filepath.Glob(g)
			for _, f := range m {
				os.Remove(f)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []byte
	err := vm.Do(func() error {
		var err error
		out, err = exec.CommandContext(ctx, "dhcpcd", "-f", conf, "-c", script, "-1", "-4", "-B", "-t", "10", ifName).CombinedOutput()
		return err
	})
	if err != nil || !waitEvent(t, dir, "BOUND", time.Second) {
		t.Fatalf("dhcpcd got no lease: %v\n%s", err, out)
	}
	got := readConfigured(t, vm, ifName)
	want := p.wantConfigured()
	// dhcpcd adds its routes with its own metric; compare destinations.
	if !slices.Equal(got.Addrs, want.Addrs) || got.MTU != want.MTU || !slices.Equal(got.Routes, want.Routes) {
		t.Errorf("dhcpcd configured %s, the CNI result says %s", got, want)
	}
	checkOptions(t, "dhcpcd", readEnv(t, filepath.Join(dir, "BOUND.env")),
		"new_domain_name_servers", "new_domain_search", "new_domain_name", "new_host_name", "new_interface_mtu")
	_, _ = run(t, vm, 10*time.Second, "dhcpcd", "-f", conf, "-x", ifName)
}
