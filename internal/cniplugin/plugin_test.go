package cniplugin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/cnirun"
)

func request(env map[string]string, stdin string) cnirun.Request {
	r := cnirun.Request{Service: "skein.v1.CNI", Stdin: []byte(stdin)}
	for k, v := range env {
		r.Env = append(r.Env, k+"="+v)
	}
	return r
}

var addEnv = map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/p", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}

// specError decodes what Run printed as a spec error.
func specError(t *testing.T, rep cnirun.Reply) (version string, code uint, msg string) {
	t.Helper()
	var e struct {
		CNIVersion string `json:"cniVersion"`
		Code       uint   `json:"code"`
		Msg        string `json:"msg"`
	}
	if rep.Exit != 1 || json.Unmarshal(rep.Stdout, &e) != nil {
		t.Fatalf("exit %d, stdout %q: want a spec error", rep.Exit, rep.Stdout)
	}
	return e.CNIVersion, e.Code, e.Msg
}

// TestRunCallsAndPrints: a valid ADD reaches the caller with the
// runtime's arguments and its result is printed; a spec error from the
// call is printed in the configuration's version.
func TestRunCallsAndPrints(t *testing.T) {
	conf := `{"cniVersion":"0.4.0","name":"n"}`
	var got *Args
	rep := Run(request(addEnv, conf), func(verb string, a *Args) ([]byte, error) {
		if verb != "ADD" {
			t.Errorf("verb %s", verb)
		}
		got = a
		return []byte(`{"result":1}`), nil
	})
	if rep.Exit != 0 || string(rep.Stdout) != `{"result":1}` {
		t.Fatalf("exit %d stdout %q", rep.Exit, rep.Stdout)
	}
	if got == nil || got.ContainerID != "c1" || got.Netns != "/run/netns/p" || got.IfName != "eth0" || string(got.StdinData) != conf {
		t.Errorf("args %+v", got)
	}
	rep = Run(request(addEnv, conf), func(string, *Args) ([]byte, error) {
		return nil, &Error{Code: 7, Msg: "bad pool"}
	})
	if v, code, msg := specError(t, rep); v != "0.4.0" || code != 7 || msg != "bad pool" {
		t.Errorf("error %s %d %q", v, code, msg)
	}
}

// TestRunOwnNetNS: the binary's own namespace as CNI_NETNS is refused
// before any call for ADD and CHECK, and after it for DEL (as skel does),
// judged by the namespaces the binary stat'ed.
func TestRunOwnNetNS(t *testing.T) {
	ns := cnirun.NSID{Dev: 4, Ino: 4026531840}
	for _, cmd := range []string{"ADD", "CHECK", "DEL"} {
		env := map[string]string{}
		for k, v := range addEnv {
			env[k] = v
		}
		env["CNI_COMMAND"] = cmd
		req := request(env, `{"cniVersion":"1.0.0","name":"n"}`)
		req.SelfNS, req.PodNS = ns, ns
		called := false
		rep := Run(req, func(string, *Args) ([]byte, error) { called = true; return nil, nil })
		_, code, _ := specError(t, rep)
		want := uint(errInvalidEnvironmentVariables)
		if cmd == "DEL" {
			want = errInvalidNetNS
		}
		if code != want || called != (cmd == "DEL") {
			t.Errorf("%s into the binary's namespace: code %d (want %d), called %v", cmd, code, want, called)
		}
		req.PodNS = cnirun.NSID{Dev: 4, Ino: 1}
		if rep := Run(req, func(string, *Args) ([]byte, error) { return nil, nil }); rep.Exit != 0 {
			t.Errorf("%s into another namespace: exit %d %s", cmd, rep.Exit, rep.Stdout)
		}
	}
}

// TestRunChecksFirst: a request skel would refuse never reaches the
// caller.
func TestRunChecksFirst(t *testing.T) {
	for name, stdin := range map[string]string{"not json": `{`, "no name": `{"cniVersion":"1.0.0"}`, "version": `{"cniVersion":"7.0.0","name":"n"}`} {
		rep := Run(request(addEnv, stdin), func(string, *Args) ([]byte, error) {
			t.Errorf("%s: called", name)
			return nil, nil
		})
		specError(t, rep)
	}
}

func TestCallFailed(t *testing.T) {
	cases := []struct {
		code int
		want uint
	}{
		{codeUnavailable, errTryAgainLater},
		{codeDeadlineExceeded, errTryAgainLater},
		{codeUnimplemented, errPluginNotAvailable},
		{13, errInternal},
	}
	for _, c := range cases {
		e := CallFailed("ADD", c.code, "boom", time.Minute)
		if e.Code != c.want || e.Msg == "" {
			t.Errorf("status %d: %+v, want code %d", c.code, e, c.want)
		}
	}
	if e := CallFailed("ADD", codeDeadlineExceeded, "", time.Minute); !strings.Contains(e.Msg, "1m0s") {
		t.Errorf("deadline: %q names no timeout", e.Msg)
	}
}

// TestVersionOf: the version an error is reported in. A configuration
// without cniVersion is 0.1.0 (the spec, libcni); one that cannot be
// decoded has none.
func TestVersionOf(t *testing.T) {
	for in, want := range map[string]string{
		`{"cniVersion":"0.2.0","name":"n"}`: "0.2.0",
		`{"cniVersion":"1.1.0"}`:            "1.1.0",
		`{"name":"n"}`:                      "0.1.0",
		`{"cniVersion":"","name":"n"}`:      "0.1.0",
		`{"cniVersion":`:                    "",
		`[]`:                                "",
	} {
		if got := versionOf([]byte(in)); got != want {
			t.Errorf("versionOf(%s) = %q, want %q", in, got, want)
		}
	}
}
