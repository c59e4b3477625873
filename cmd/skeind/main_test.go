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
