package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakePlugin writes a CNI plugin script into a new bin directory: it logs
// its environment and stdin into the directory and runs body.
func fakePlugin(t *testing.T, name, body string) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\nenv | grep ^CNI_ | sort > " + dir + "/env\ncat > " + dir + "/stdin\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type outcome struct {
	code           int
	stdout, stderr string
}

func invoke(t *testing.T, binDir, state string, argv []string, config string) outcome {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "SKEIN_NETPLUGIN_STATE" {
			return state
		}
		return ""
	}
	code := run(argv, strings.NewReader(config), &stdout, &stderr, getenv, binDir)
	return outcome{code, stdout.String(), stderr.String()}
}

func cniErr(t *testing.T, out string) cniError {
	t.Helper()
	var e cniError
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("stdout %q is not a CNI error: %v", out, err)
	}
	return e
}

const result = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth1"}],"ips":[{"address":"10.1.0.2/24","interface":0}]}`

// TestAddDel: add and del run the plugin with the CNI environment, the
// config unchanged on ADD, the kept result as prevResult on DEL.
func TestAddDel(t *testing.T) {
	bin := fakePlugin(t, "fake", "echo '"+result+"'")
	state := t.TempDir()
	conf := `{"cniVersion":"1.0.0","name":"n1","type":"fake","image":"file:///x","extra":{"k":1}}`

	got := invoke(t, bin, state, []string{"/opt/network/add", "/run/netns/p", "c0ffee", "eth1"}, conf)
	if got.code != 0 || strings.TrimSpace(got.stdout) != result {
		t.Fatalf("add: %+v", got)
	}
	env, _ := os.ReadFile(filepath.Join(bin, "env"))
	want := "CNI_COMMAND=ADD\nCNI_CONTAINERID=c0ffee\nCNI_IFNAME=eth1\nCNI_NETNS=/run/netns/p\nCNI_PATH=" + bin + "\n"
	if string(env) != want {
		t.Errorf("add env:\n%s\nwant:\n%s", env, want)
	}
	if stdin, _ := os.ReadFile(filepath.Join(bin, "stdin")); string(stdin) != conf {
		t.Errorf("add stdin %q, want the config unchanged", stdin)
	}
	kept := (&call{name: "n1", id: "c0ffee", ifname: "eth1"}).resultPath(state)
	if b, err := os.ReadFile(kept); err != nil || strings.TrimSpace(string(b)) != result {
		t.Errorf("kept result %q %v", b, err)
	}

	got = invoke(t, bin, state, []string{"/opt/network/del", "/run/netns/p", "c0ffee", "eth1"}, conf)
	if got.code != 0 {
		t.Fatalf("del: %+v", got)
	}
	if env, _ := os.ReadFile(filepath.Join(bin, "env")); !strings.Contains(string(env), "CNI_COMMAND=DEL\n") {
		t.Errorf("del env %s", env)
	}
	var sent map[string]json.RawMessage
	stdin, _ := os.ReadFile(filepath.Join(bin, "stdin"))
	if err := json.Unmarshal(stdin, &sent); err != nil {
		t.Fatal(err)
	}
	var prev, wantPrev any
	_ = json.Unmarshal(sent["prevResult"], &prev)
	_ = json.Unmarshal([]byte(result), &wantPrev)
	if prev == nil || !jsonEqual(prev, wantPrev) || string(sent["extra"]) != `{"k":1}` {
		t.Errorf("del stdin %s: want the config with prevResult", stdin)
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Errorf("kept result still there after DEL: %v", err)
	}

	// DEL again (nothing kept): the config as given.
	got = invoke(t, bin, state, []string{"skein-netplugin", "del", "/run/netns/p", "c0ffee", "eth1"}, conf)
	if stdin, _ := os.ReadFile(filepath.Join(bin, "stdin")); got.code != 0 || string(stdin) != conf {
		t.Errorf("second del: %+v stdin %s", got, stdin)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestOldVersionNoPrevResult: a 0.3.1 config gets no prevResult on DEL.
func TestOldVersionNoPrevResult(t *testing.T) {
	bin := fakePlugin(t, "fake", "echo '{\"cniVersion\":\"0.3.1\",\"ips\":[]}'")
	state := t.TempDir()
	conf := `{"cniVersion":"0.3.1","name":"n1","type":"fake"}`
	if got := invoke(t, bin, state, []string{"add", "/n", "c", "eth0"}, conf); got.code != 0 {
		t.Fatal(got)
	}
	if got := invoke(t, bin, state, []string{"del", "/n", "c", "eth0"}, conf); got.code != 0 {
		t.Fatal(got)
	}
	if stdin, _ := os.ReadFile(filepath.Join(bin, "stdin")); string(stdin) != conf {
		t.Errorf("del stdin %s", stdin)
	}
}

// TestPluginFailure: the plugin's exit status and error object pass
// through; nothing is kept.
func TestPluginFailure(t *testing.T) {
	bin := fakePlugin(t, "fake", `echo '{"code":11,"msg":"busy"}'; echo oops >&2; exit 3`)
	state := t.TempDir()
	got := invoke(t, bin, state, []string{"add", "/n", "c", "eth0"}, `{"cniVersion":"1.0.0","name":"n","type":"fake"}`)
	if got.code != 3 || cniErr(t, got.stdout).Code != 11 || !strings.Contains(got.stderr, "oops") {
		t.Errorf("got %+v", got)
	}
	if _, err := os.Stat(filepath.Join(state, resultsDir)); !os.IsNotExist(err) {
		t.Errorf("a failed ADD kept something: %v", err)
	}
}

// TestBadCalls: each bad invocation is a CNI error on stdout, exit 1, and
// the plugin never runs.
func TestBadCalls(t *testing.T) {
	bin := fakePlugin(t, "fake", "echo '{}'")
	for _, tc := range []struct {
		name   string
		argv   []string
		config string
		code   int
		msg    string
	}{
		{"no type", []string{"add", "/n", "c", "eth0"}, `{"name":"n"}`, codeInvalidConfig, "no \"type\""},
		{"type with a slash", []string{"add", "/n", "c", "eth0"}, `{"type":"../fake"}`, codeInvalidConfig, "not a plugin name"},
		{"type not a string", []string{"add", "/n", "c", "eth0"}, `{"type":7}`, codeInvalidConfig, "want a string"},
		{"unknown plugin", []string{"add", "/n", "c", "eth0"}, `{"type":"bridge"}`, codeInvalidConfig, "no CNI plugin \"bridge\""},
		{"not json", []string{"add", "/n", "c", "eth0"}, `{`, codeDecoding, "decode config"},
		{"too few args", []string{"add", "/n"}, `{"type":"fake"}`, codeInvalidEnv, "NETNS UUID"},
		{"unknown op", []string{"skein-netplugin", "check", "/n", "c", "eth0"}, `{"type":"fake"}`, codeInvalidEnv, "unknown operation"},
		{"no interface", []string{"add", "/n", "c", ""}, `{"type":"fake"}`, codeInvalidEnv, "no interface name"},
		{"empty uuid", []string{"add", "/n", "", "eth0"}, `{"type":"fake"}`, codeInvalidEnv, "must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(filepath.Join(bin, "env"))
			got := invoke(t, bin, t.TempDir(), tc.argv, tc.config)
			e := cniErr(t, got.stdout)
			if got.code != 1 || e.Code != tc.code || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got %+v, want code %d and %q", got, tc.code, tc.msg)
			}
			if _, err := os.Stat(filepath.Join(bin, "env")); !os.IsNotExist(err) {
				t.Error("the plugin ran")
			}
		})
	}
}

// TestLoopbackDefaultsToLo: loopback needs no interface argument.
func TestLoopbackDefaultsToLo(t *testing.T) {
	bin := fakePlugin(t, "loopback", "echo '{}'")
	if got := invoke(t, bin, t.TempDir(), []string{"add", "/n", "c"}, `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`); got.code != 0 {
		t.Fatal(got)
	}
	if env, _ := os.ReadFile(filepath.Join(bin, "env")); !strings.Contains(string(env), "CNI_IFNAME=lo\n") {
		t.Errorf("env %s", env)
	}
}

// TestImports keeps the shim static and small: the standard library only.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(dep, "/")
		if strings.Contains(first, ".") && dep != "github.com/skeinnet/skein/cmd/skein-netplugin" {
			t.Errorf("cmd/skein-netplugin imports %s; keep the shim to the standard library", dep)
		}
	}
}

// TestDelNetNSGone: a DEL whose netns no longer exists runs the plugin
// without CNI_NETNS (CNI: DEL must succeed, freeing what is outside the
// namespace) instead of passing a path the plugin cannot open.
func TestDelNetNSGone(t *testing.T) {
	bin := fakePlugin(t, "fake", "")
	state := t.TempDir()
	conf := `{"cniVersion":"1.0.0","name":"n1","type":"fake"}`
	gone := filepath.Join(t.TempDir(), "pod-ns")
	got := invoke(t, bin, state, []string{"/opt/network/del", gone, "c0ffee", "eth1"}, conf)
	if got.code != 0 {
		t.Fatalf("del: %+v", got)
	}
	env, _ := os.ReadFile(filepath.Join(bin, "env"))
	if !strings.Contains(string(env), "CNI_COMMAND=DEL\n") || strings.Contains(string(env), "CNI_NETNS") {
		t.Errorf("del env:\n%s\nwant DEL without CNI_NETNS", env)
	}
	// None at all (a CNI DEL without CNI_NETNS) is fine too.
	if got := invoke(t, bin, state, []string{"/opt/network/del", "", "c0ffee", "eth1"}, conf); got.code != 0 {
		t.Errorf("del without a netns: %+v", got)
	}
	// One that exists is passed.
	here := t.TempDir()
	invoke(t, bin, state, []string{"/opt/network/del", here, "c0ffee", "eth1"}, conf)
	if env, _ := os.ReadFile(filepath.Join(bin, "env")); !strings.Contains(string(env), "CNI_NETNS="+here+"\n") {
		t.Errorf("del env:\n%s\nwant CNI_NETNS=%s", env, here)
	}
}

// TestResultKeys: the kept results of different (network, container,
// interface) triples never share a file, even where a plain join with
// '_' would ("a_b"+"c" and "a"+"b_c").
func TestResultKeys(t *testing.T) {
	state := t.TempDir()
	seen := map[string]string{}
	for _, c := range []call{
		{name: "a_b", id: "c", ifname: "eth0"},
		{name: "a", id: "b_c", ifname: "eth0"},
		{name: "a", id: "b", ifname: "c_eth0"},
		{name: "a", id: "b_c_eth0"},
		{name: "a", id: "b/c", ifname: "eth0"},
	} {
		p := c.resultPath(state)
		if p == "" || filepath.Dir(p) != filepath.Join(state, resultsDir) {
			t.Errorf("%+v: result path %q, want one under %s", c, p, resultsDir)
			continue
		}
		if other, dup := seen[p]; dup {
			t.Errorf("%+v and %s share the kept result %s", c, other, p)
		}
		seen[p] = fmt.Sprintf("%+v", c)
	}
}
