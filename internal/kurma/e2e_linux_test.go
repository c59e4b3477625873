package kurma_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// skeinctl runs the real skeinctl against d.
func skeinctl(t *testing.T, d *skeintest.Daemon, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(d.BinDir, "skeinctl"), append([]string{"--socket", d.Socket}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func writeConfig(t *testing.T, path, nets string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(`{"pod_networks": `+string(netsJSON(nets))+`}`), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSkeind drives the real binaries: skeind with podNetworks in its
// config file (under Kurma's key pod_networks), `skeinctl pod attach` to
// the defaults, `pod status -o json`, a SIGKILL and restart of skeind
// between attach and detach (the del still runs: its plugin's marker), a
// SIGHUP adding a network, one with a bad config (logged, old kept), and a
// bad config refused at start.
func TestSkeind(t *testing.T) {
	needRoot(t)
	cfg := filepath.Join(t.TempDir(), "skeind.json")
	base := `[
  {"name":"pods","type":"skein","containerInterface":"eth0","default":true},
  {"name":"good","image":"%IMG%","type":"test","mode":"ok","addr":"10.1.0.5/24","containerInterface":"net{{num}}","default":true}`
	writeConfig(t, cfg, base+"]")
	d := skeintest.StartDaemon(t, skeintest.Options{Args: []string{"--config", cfg}})
	pod := harness.NewNS(t, "kpod")
	before := harness.HostNet(t)

	out, err := skeinctl(t, d, "pod", "attach", "--id", uuid1, "--netns", pod.Path())
	if err != nil {
		t.Fatalf("pod attach: %v\n%s", err, out)
	}
	t.Logf("pod attach:\n%s", out)
	if !strings.Contains(out, "10.1.0.5/24") || !strings.Contains(out, "pool default") {
		t.Errorf("attach table lacks the plugin's address or the pool:\n%s", out)
	}
	out, err = skeinctl(t, d, "pod", "status", "--id", uuid1, "-o", "json")
	if err != nil {
		t.Fatalf("pod status: %v\n%s", err, out)
	}
	var st struct {
		ID          string `json:"id"`
		Attachments []struct {
			Network, Ifname, State string
		} `json:"attachments"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	if st.ID != uuid1 || len(st.Attachments) != 2 || st.Attachments[0].Ifname != "eth0" || st.Attachments[1].Ifname != "net1" || st.Attachments[1].State != "attached" {
		t.Errorf("status %+v", st)
	}
	if got := links(t, pod); !equal(got, []string{"eth0", "net1"}) {
		t.Errorf("pod interfaces %v", got)
	}

	// A crash between attach and detach: the del runs from the record.
	d.Kill(t)
	d.Start(t)
	if out, err := skeinctl(t, d, "pod", "detach", "--id", uuid1); err != nil {
		t.Fatalf("pod detach after restart: %v\n%s", err, out)
	}
	marker := filepath.Join(d.Dir, "state", "pod-networks", "good", "del-"+uuid1+"-net1")
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the plugin's del did not run after the restart: %v", err)
	}
	if got := links(t, pod); len(got) > 0 {
		t.Errorf("interfaces left: %v", got)
	}
	if atts := d.Attachments(t); len(atts) > 0 {
		t.Errorf("skein attachments left: %v", atts)
	}
	if out, err := skeinctl(t, d, "pod", "status", "--id", uuid1); err == nil || !strings.Contains(out, "no pod networks recorded") {
		t.Errorf("status of a detached pod: %v\n%s", err, out)
	}

	// SIGHUP adds a network.
	writeConfig(t, cfg, base+`,
  {"name":"extra","image":"%IMG%","type":"test","mode":"old","addr":"10.9.0.5/24","containerInterface":"x{{num}}"}]`)
	d.Signal(t, syscall.SIGHUP)
	waitLog(t, d, "pod networks reloaded")
	if out, err := skeinctl(t, d, "pod", "attach", "--id", uuid1, "--netns", pod.Path(), "--network", "extra@ext0"); err != nil || !strings.Contains(out, "10.9.0.5/24") {
		t.Fatalf("attach to the reloaded network: %v\n%s", err, out)
	}
	// A bad config is logged and the running networks stay.
	os.WriteFile(cfg, []byte(`{"podNetworks":[{"name":"broken","type":"nope"}]}`), 0o644)
	d.Signal(t, syscall.SIGHUP)
	waitLog(t, d, "pod networks not reloaded")
	if !strings.Contains(d.Log(), `network \"broken\": no image`) {
		t.Errorf("the log does not say what is wrong:\n%s", d.Log())
	}
	pod2 := harness.NewNS(t, "kpod")
	if out, err := skeinctl(t, d, "pod", "attach", "--id", "pod-two", "--netns", pod2.Path(), "--network", "extra"); err != nil {
		t.Fatalf("attach after a refused reload: %v\n%s", err, out)
	}
	for _, id := range []string{uuid1, "pod-two"} {
		if out, err := skeinctl(t, d, "pod", "detach", "--id", id); err != nil {
			t.Errorf("detach %s: %v\n%s", id, err, out)
		}
	}
	if got := links(t, pod); len(got) > 0 {
		t.Errorf("interfaces left: %v", got)
	}
	// Bad input through the CLI: a clear error, nothing attached.
	if out, err := skeinctl(t, d, "pod", "attach", "--id", uuid1, "--netns", pod.Path(), "--network", "nosuch"); err == nil || !strings.Contains(out, `unknown network "nosuch"`) {
		t.Errorf("unknown network: %v\n%s", err, out)
	}
	d.Stop(t)
	harness.AssertHostSame(t, before, "after the pod networks test")

	// A config that does not validate stops skeind at start, saying why.
	cmd := exec.Command(filepath.Join(d.BinDir, "skeind"), "--config", cfg, "--node-netns", d.Node.Path(),
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--socket", filepath.Join(t.TempDir(), "s.sock"),
		"--metrics-addr", "off", "--docker-socket", "off")
	out2, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out2), `podNetworks[0]: network "broken"`) {
		t.Errorf("skeind with a bad pod network config: %v\n%s", err, out2)
	}
}

func waitLog(t *testing.T, d *skeintest.Daemon, s string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(d.Log(), s) {
			return
		}
	}
	t.Fatalf("skeind never logged %q:\n%s", s, d.Log())
}
