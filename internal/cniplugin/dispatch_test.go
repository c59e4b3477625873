package cniplugin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/skeinnet/skein/internal/cnispec"
)

// outcome is everything a run of a dispatcher shows the runtime: the error
// (code, message, details), what went to stdout and stderr, and which
// verbs were called with what.
type outcome struct {
	err            string
	stdout, stderr string
	calls          []string
}

// recorder makes verbs that record their calls and return fail (if any),
// as the error type of the dispatcher under test.
func recorder(o *outcome, fail func() error) Verbs {
	rec := func(verb string) func(*Args) error {
		return func(a *Args) error {
			o.calls = append(o.calls, fmt.Sprintf("%s %+v", verb, *a))
			if fail != nil {
				return fail()
			}
			return nil
		}
	}
	return Verbs{Add: rec("ADD"), Del: rec("DEL"), Check: rec("CHECK"), GC: rec("GC"), Status: rec("STATUS")}
}

func describe(code uint, msg, details string) string {
	return fmt.Sprintf("code %d msg %q details %q", code, msg, details)
}

func runOurs(env map[string]string, stdin string, fail func() error, about string) outcome {
	var o outcome
	var out, errOut bytes.Buffer
	e := dispatch(func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut, recorder(&o, fail), about, isOwnNetNS(env["CNI_NETNS"]))
	if e != nil {
		o.err = describe(e.Code, e.Msg, e.Details)
	}
	o.stdout, o.stderr = out.String(), errOut.String()
	return o
}

// isOwnNetNS reports whether path names the test's own network namespace,
// as skel judges CNI_NETNS.
func isOwnNetNS(path string) bool {
	var pod, self syscall.Stat_t
	if path == "" || syscall.Stat(path, &pod) != nil || syscall.Stat("/proc/thread-self/ns/net", &self) != nil {
		return false
	}
	return pod.Dev == self.Dev && pod.Ino == self.Ino
}

// runSkel runs the CNI library's skel, which the plugin used before
// dispatch.go, on the same input: through the process's environment and
// standard streams, as skel reads them.
func runSkel(t *testing.T, env map[string]string, stdin string, fail func() error, about string) outcome {
	t.Helper()
	for _, ev := range envVars {
		if v, ok := env[ev.name]; ok {
			os.Setenv(ev.name, v)
		} else {
			os.Unsetenv(ev.name)
		}
	}
	defer func() {
		for _, ev := range envVars {
			os.Unsetenv(ev.name)
		}
	}()
	streams := [3]**os.File{&os.Stdin, &os.Stdout, &os.Stderr}
	saved := [3]*os.File{os.Stdin, os.Stdout, os.Stderr}
	defer func() {
		for i, s := range streams {
			*s = saved[i]
		}
	}()
	files := [3]*os.File{}
	for i := range files {
		f, err := os.CreateTemp(t.TempDir(), "stream")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
		*streams[i] = f
	}
	files[0].WriteString(stdin)
	files[0].Seek(0, io.SeekStart)

	var o outcome
	ours := recorder(&o, fail)
	adapt := func(fn func(*Args) error) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			err := fn(&Args{ContainerID: a.ContainerID, Netns: a.Netns, IfName: a.IfName, Args: a.Args, Path: a.Path,
				NetnsOverride: a.NetnsOverride, StdinData: a.StdinData})
			var e *Error
			if errors.As(err, &e) {
				return types.NewError(e.Code, e.Msg, e.Details)
			}
			return err
		}
	}
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{
		Add: adapt(ours.Add), Del: adapt(ours.Del), Check: adapt(ours.Check), GC: adapt(ours.GC), Status: adapt(ours.Status),
	}, version.PluginSupports(cnispec.Versions...), about)
	if e != nil {
		o.err = describe(e.Code, e.Msg, e.Details)
	}
	for i, p := range []*string{&o.stdout, &o.stderr} {
		b, err := os.ReadFile(files[i+1].Name())
		if err != nil {
			t.Fatal(err)
		}
		*p = string(b)
	}
	return o
}

// TestDispatchAsSkel: for every verb, configuration and environment in the
// table — valid and broken in each way skel checks — dispatch gives the
// runtime exactly what skel gave: the same error, output and verb calls.
func TestDispatchAsSkel(t *testing.T) {
	base := map[string]string{
		"CNI_CONTAINERID": "ctr-1", "CNI_NETNS": "/run/netns/no-such-pod", "CNI_IFNAME": "eth0",
		"CNI_PATH": "/opt/cni/bin", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p",
	}
	with := func(cmd string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		if cmd != "" {
			m["CNI_COMMAND"] = cmd
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	cmds := []string{"", "ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "BOGUS", "add"}
	confs := []string{
		`{"cniVersion":"1.0.0","name":"net","type":"skein"}`,
		`{"cniVersion":"1.1.0","name":"net"}`,
		`{"cniVersion":"0.3.1","name":"net"}`,
		`{"cniVersion":"0.4.0","name":"net"}`,
		`{"cniVersion":"0.2.0","name":"net"}`,
		`{"name":"net"}`,
		`{"cniVersion":"","name":"net"}`,
		`{"cniVersion":"9.9.9","name":"net"}`,
		`{"cniVersion":"1.0","name":"net"}`,
		`{"cniVersion":"1","name":"net"}`,
		`{"cniVersion":"x.1.0","name":"net"}`,
		`{"cniVersion":"1.x","name":"net"}`,
		`{"cniVersion":"1.1.y","name":"net"}`,
		`{"cniVersion":"1.0.0.0","name":"net"}`,
		`{"cniVersion":1,"name":"net"}`,
		`{"cniVersion":"1.0.0"}`,
		`{"cniVersion":"1.0.0","name":""}`,
		`{"cniVersion":"1.0.0","name":"bad name"}`,
		`{"cniVersion":"1.0.0","name":"-lead"}`,
		`{"cniVersion":"1.0.0","name":7}`,
		`{"CNIVERSION":"1.1.0","NAME":"net"}`,
		`not json`, `[]`, `null`, ``, `{"cniVersion":"1.0.0","name":"net"} trailing`,
	}
	fails := map[string]func() error{
		"ok":        nil,
		"spec-err":  func() error { return newError(errTryAgainLater, "busy", "try later") },
		"plain-err": func() error { return errors.New("boom") },
	}
	type tc struct {
		name  string
		env   map[string]string
		stdin string
		fail  string
		about string
	}
	var cases []tc
	for _, cmd := range cmds {
		for i, c := range confs {
			for f := range fails {
				cases = append(cases, tc{fmt.Sprintf("%s/conf%d/%s", cmd, i, f), with(cmd), c, f, "skein CNI plugin test"})
			}
		}
		envs := [][]string{
			{"CNI_CONTAINERID", "<unset>"}, {"CNI_NETNS", "<unset>"}, {"CNI_IFNAME", "<unset>"}, {"CNI_PATH", "<unset>"},
			{"CNI_ARGS", "<unset>"}, {"CNI_CONTAINERID", "<unset>", "CNI_IFNAME", "<unset>", "CNI_PATH", "<unset>"},
			{"CNI_CONTAINERID", "a b"}, {"CNI_CONTAINERID", "-lead"}, {"CNI_CONTAINERID", "ok_1.2-3"},
			{"CNI_CONTAINERID", "a b", "CNI_IFNAME", "<unset>"},
			{"CNI_IFNAME", "thisnameistoolong"}, {"CNI_IFNAME", "."}, {"CNI_IFNAME", ".."}, {"CNI_IFNAME", "a/b"},
			{"CNI_IFNAME", "a:b"}, {"CNI_IFNAME", "a\tb"}, {"CNI_IFNAME", "a\u00a0b"}, {"CNI_IFNAME", "ünï"},
			{"CNI_NETNS", "/proc/self/ns/net"}, {"CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "true"},
			{"CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "1"}, {"CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "no"},
		}
		for i, kv := range envs {
			for _, c := range []string{confs[0], confs[1]} {
				cases = append(cases, tc{fmt.Sprintf("%s/env%d", cmd, i), with(cmd, kv...), c, "ok", "skein CNI plugin test"})
			}
		}
		cases = append(cases, tc{cmd + "/no-about", with(cmd, "CNI_CONTAINERID", "<unset>"), confs[0], "ok", ""})
	}
	for _, c := range cases {
		want := runSkel(t, c.env, c.stdin, fails[c.fail], c.about)
		got := runOurs(c.env, c.stdin, fails[c.fail], c.about)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s (env %v, stdin %q):\n got  %+v\n skel %+v", c.name, c.env, c.stdin, got, want)
		}
	}
	t.Logf("%d cases", len(cases))
}
