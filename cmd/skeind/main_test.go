package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestShippedConfigLoads(t *testing.T) {
	c, err := loadConfig("../../deploy/skeind.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Dataplane.PodTable != 116 || c.Dataplane.ExportTable != 119 || len(c.Pools) != 1 || c.Pools[0].Name != "default" {
		t.Errorf("deploy/skeind.json decoded wrong: %+v", c)
	}
}

func TestConfigRejectsUnknownFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(p, []byte(`{"stateDir":"/x","metricAddr":"127.0.0.1:1"}`), 0o600)
	_, err := loadConfig(p)
	if err == nil || !strings.Contains(err.Error(), "metricAddr") {
		t.Fatalf("err = %v, want one naming the unknown field", err)
	}
}

func TestFlagsParse(t *testing.T) {
	cmd := newCommand()
	cmd.SetArgs([]string{"--log-format", "xml", "--metrics-addr", "off", "--state-dir", t.TempDir()})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "log-format") {
		t.Fatalf("err = %v, want a --log-format error", err)
	}
}

// TestNodeForwardingOneDefault: --node-forwarding defaults the same with
// flags alone and with a configuration file that does not mention it; a
// file can still turn it off.
func TestNodeForwardingOneDefault(t *testing.T) {
	flag := newCommand().Flags().Lookup("node-forwarding")
	if flag.DefValue != "true" {
		t.Fatalf("--node-forwarding defaults to %s", flag.DefValue)
	}
	dir := t.TempDir()
	for _, tt := range []struct {
		file string
		want bool
	}{
		{`{}`, true},
		{`{"dataplane":{"podTable":116}}`, true},
		{`{"dataplane":{"nodeForwarding":false}}`, false},
		{`{"dataplane":{"nodeForwarding":true}}`, true},
	} {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, []byte(tt.file), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		if c.Dataplane.NodeForwarding != tt.want {
			t.Errorf("config %s: nodeForwarding %v, want %v (the flag's default is %s)", tt.file, c.Dataplane.NodeForwarding, tt.want, flag.DefValue)
		}
	}
}
