package cniplugin

import (
	"errors"
	"testing"

	"github.com/skeinnet/skein/internal/cniclient"
)

func TestSocketPath(t *testing.T) {
	t.Setenv("SKEIN_SOCKET", "")
	if got := SocketPath([]byte(`{"name":"n"}`)); got != DefaultSocket {
		t.Errorf("no socket anywhere: %q, want %q", got, DefaultSocket)
	}
	t.Setenv("SKEIN_SOCKET", "/env.sock")
	if got := SocketPath([]byte(`{"name":"n"}`)); got != "/env.sock" {
		t.Errorf("$SKEIN_SOCKET: %q", got)
	}
	if got := SocketPath([]byte(`{"name":"n","socket":"/conf.sock"}`)); got != "/conf.sock" {
		t.Errorf("netconf socket should win over the environment: %q", got)
	}
}

func TestRPCErrorCodes(t *testing.T) {
	p := Plugin{Service: "skein.v1.VM", Unimplemented: "no VMs here"}
	cases := []struct {
		verb string
		err  error
		code uint
	}{
		{"ADD", errors.Join(cniclient.ErrUnavailable), errTryAgainLater},
		{"STATUS", errors.Join(cniclient.ErrUnavailable), errPluginNotAvailable},
		{"DEL", &cniclient.StatusError{Code: cniclient.CodeUnavailable}, errTryAgainLater},
		{"ADD", &cniclient.StatusError{Code: cniclient.CodeDeadlineExceeded}, errTryAgainLater},
		{"ADD", &cniclient.StatusError{Code: codeUnimplemented}, errPluginNotAvailable},
		{"ADD", &cniclient.StatusError{Code: 13, Message: "boom"}, errInternal},
	}
	for _, c := range cases {
		e := p.rpcError(c.verb, "/s.sock", c.err).(*Error)
		if e.Code != c.code || e.Msg == "" {
			t.Errorf("%s %v: code %d %q, want %d", c.verb, c.err, e.Code, e.Msg, c.code)
		}
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

// TestNotOwnNetNS: the plugin refuses its own (the runtime's) namespace,
// by any path, before calling skeind; other paths are skeind's to judge.
func TestNotOwnNetNS(t *testing.T) {
	for _, p := range []string{"/proc/self/ns/net", "/proc/thread-self/ns/net"} {
		err := notOwnNetNS(p)
		var e *Error
		if !errors.As(err, &e) || e.Code != errInvalidEnvironmentVariables {
			t.Errorf("CNI_NETNS=%s: %v, want error code 4", p, err)
		}
	}
	for _, p := range []string{"", "/nonexistent", "/proc/self/ns/mnt"} {
		if err := notOwnNetNS(p); err != nil {
			t.Errorf("CNI_NETNS=%q: %v, want it left to skeind", p, err)
		}
	}
}
