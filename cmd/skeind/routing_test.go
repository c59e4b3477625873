package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRoutingFlags: bad routing settings are refused with a message naming
// the flag, before anything is opened or created.
func TestRoutingFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--routing", "bgp"}, `--routing: routing mode "bgp": want export, direct or vxlan`},
		{"direct without kubernetes", []string{"--routing", "direct"}, "--routing direct needs --store kubernetes"},
		{"vxlan without kubernetes", []string{"--routing", "vxlan"}, "--routing vxlan needs --store kubernetes"},
		{"node address without kubernetes", []string{"--node-address", "192.0.2.1"}, "--node-address needs --store kubernetes"},
		{"bad node address", []string{"--store", "kubernetes", "--node", "n1", "--routing", "direct", "--node-address", "192.0.2.300"}, "--node-address: node address \"192.0.2.300\""},
		{"two IPv4 node addresses", []string{"--store", "kubernetes", "--node", "n1", "--node-address", "192.0.2.1,192.0.2.2"}, "more than one address of a family"},
		{"vni out of range", []string{"--store", "kubernetes", "--node", "n1", "--routing", "vxlan", "--vxlan-vni", "16777216"}, "--vxlan-vni 16777216: want 1..16777215"},
		{"port out of range", []string{"--store", "kubernetes", "--node", "n1", "--routing", "vxlan", "--vxlan-port", "65536"}, "--vxlan-port 65536"},
		{"mtu out of range", []string{"--store", "kubernetes", "--node", "n1", "--routing", "vxlan", "--vxlan-mtu", "100"}, "--vxlan-mtu 100: want 1280..65535"},
		{"vxlan flag in direct mode", []string{"--store", "kubernetes", "--node", "n1", "--routing", "direct", "--vxlan-vni", "7"}, "--vxlan-vni needs --routing vxlan"},
		{"vxlan flag in export mode", []string{"--vxlan-port", "8472"}, "--vxlan-port needs --routing vxlan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			cmd := newCommand()
			// A kubeconfig that does not exist: nothing may get as far as
			// reading it.
			cmd.SetArgs(append([]string{"--metrics-addr", "off", "--docker-socket", "off", "--state-dir", state,
				"--kubeconfig", filepath.Join(t.TempDir(), "none")}, tc.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("the state directory was created (%v)", err)
			}
		})
	}
}

// TestRoutingConfigFile: the configuration file's routing section is
// read strictly, and flags given explicitly win over it.
func TestRoutingConfigFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.json")
	os.WriteFile(p, []byte(`{"routing":{"mode":"vxlan","nodeAddress":"192.0.2.1","vxlan":{"vni":7,"port":8472,"mtu":1400}}}`), 0o600)
	c, err := loadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Routing
	if r.Mode != "vxlan" || r.NodeAddress != "192.0.2.1" || r.VXLAN.VNI != 7 || r.VXLAN.Port != 8472 || r.VXLAN.MTU != 1400 {
		t.Errorf("routing section decoded wrong: %+v", r)
	}
	os.WriteFile(p, []byte(`{"routing":{"mode":"vxlan","vxlan":{"vnid":7}}}`), 0o600)
	if _, err := loadConfig(p); err == nil || !strings.Contains(err.Error(), "vnid") {
		t.Errorf("a misspelt routing setting: %v, want an error naming it", err)
	}
	// The file's direct mode needs the kubernetes store; an explicit
	// --routing export overrides it, so the error is then another one.
	os.WriteFile(p, []byte(`{"routing":{"mode":"direct"}}`), 0o600)
	state := filepath.Join(dir, "state")
	cmd := newCommand()
	cmd.SetArgs([]string{"--config", p, "--metrics-addr", "off", "--state-dir", state})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--routing direct needs --store kubernetes") {
		t.Errorf("config file with direct mode on the embedded store: %v", err)
	}
	cmd = newCommand()
	cmd.SetArgs([]string{"--config", p, "--routing", "export", "--vxlan-mtu", "1400", "--metrics-addr", "off", "--state-dir", state})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--vxlan-mtu needs --routing vxlan") {
		t.Errorf("--routing export over the file's direct: %v", err)
	}
}

// TestVXLANPodMTU: in vxlan mode --mtu 0 takes the device's MTU, a smaller
// --mtu stands, and a larger one is refused (it was accepted silently, and
// large pod packets were dropped between nodes).
func TestVXLANPodMTU(t *testing.T) {
	for _, c := range []struct{ pod, dev, want int }{{0, 1450, 1450}, {1400, 1450, 1400}, {1450, 1450, 1450}, {0, 1230, 1230}} {
		if got, err := vxlanPodMTU(c.pod, c.dev); err != nil || got != c.want {
			t.Errorf("vxlanPodMTU(%d, %d) = %d, %v; want %d", c.pod, c.dev, got, err, c.want)
		}
	}
	if _, err := vxlanPodMTU(1500, 1450); err == nil || !strings.Contains(err.Error(), "--mtu 1500 is larger than the VXLAN device's MTU 1450") {
		t.Errorf("vxlanPodMTU(1500, 1450) = %v, want a refusal naming both", err)
	}
}
