package cnirun

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc"

	"github.com/skeinnet/skein/internal/cnispec"
)

// serve answers each connection on a new socket with f.
func serve(t *testing.T, f func(c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "skeind.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); f(c) }()
		}
	}()
	return sock
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// runPlugin runs the binary's code with env and stdin.
func runPlugin(env map[string]string, stdin string) (exit int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	exit = Plugin{Service: "skein.v1.CNI", About: "skein CNI plugin test"}.run(getenv(env), strings.NewReader(stdin), &out, &errOut)
	return exit, out.String(), errOut.String()
}

type specErr struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details"`
}

func decodeErr(t *testing.T, exit int, stdout string) specErr {
	t.Helper()
	var e specErr
	if exit != 1 || json.Unmarshal([]byte(stdout), &e) != nil {
		t.Fatalf("exit %d, stdout %q: want a spec error", exit, stdout)
	}
	return e
}

// TestRunHandsOver: the binary sends skeind its CNI_ variables (and no
// others), stdin, the service, the call's timeout and both namespaces as
// it sees them, and prints and exits with skeind's answer.
func TestRunHandsOver(t *testing.T) {
	got := make(chan Request, 1)
	sock := serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		magic := make([]byte, len(RequestMagic))
		if _, err := io.ReadFull(br, magic); err != nil || string(magic) != RequestMagic {
			t.Errorf("magic %q, %v", magic, err)
			return
		}
		req, err := ReadRequest(br)
		if err != nil {
			t.Errorf("request: %v", err)
			return
		}
		got <- req
		c.Write(AppendReply(nil, Reply{Exit: 3, Stdout: []byte("printed")}))
	})
	conf := `{"cniVersion":"1.0.0","name":"n","socket":"` + sock + `"}`
	env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
		"CNI_PATH": "/opt/cni/bin", "SKEIN_SOCKET": "/elsewhere.sock", "HOME": "/root"}
	exit, stdout, _ := runPlugin(env, conf)
	if exit != 3 || stdout != "printed" {
		t.Fatalf("exit %d stdout %q, want skeind's 3 and \"printed\"", exit, stdout)
	}
	req := <-got
	wantEnv := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin"}
	slices.Sort(req.Env)
	slices.Sort(wantEnv)
	if !slices.Equal(req.Env, wantEnv) || string(req.Stdin) != conf || req.Service != "skein.v1.CNI" || req.TimeoutMS != 60000 {
		t.Errorf("request %+v", req)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if own := (NSID{st.Dev, st.Ino}); req.SelfNS != own || req.PodNS != own {
		t.Errorf("namespaces %+v %+v, want both %+v", req.SelfNS, req.PodNS, own)
	}
	if req.Getenv("CNI_IFNAME") != "eth0" || req.Getenv("CNI_IF") != "" || req.Getenv("HOME") != "" {
		t.Errorf("Getenv")
	}

	// $SKEIN_SOCKET when the configuration names none.
	env["SKEIN_SOCKET"] = sock
	env["CNI_NETNS"] = "/nonexistent"
	if exit, stdout, _ := runPlugin(env, `{"cniVersion":"1.0.0","name":"n"}`); exit != 3 || stdout != "printed" {
		t.Fatalf("via $SKEIN_SOCKET: exit %d stdout %q", exit, stdout)
	}
	if req := <-got; req.PodNS != (NSID{}) {
		t.Errorf("a CNI_NETNS that cannot be stat'ed: %+v, want zero", req.PodNS)
	}
}

// TestRunWithoutSkeind: the binary answers a spec error in the
// configuration's version when skeind is absent, older than the binary,
// or hangs up without an answer: "try again later" (11), and for STATUS
// "plugin not available" (50).
func TestRunWithoutSkeind(t *testing.T) {
	grpcSock := filepath.Join(t.TempDir(), "grpc.sock")
	l, err := net.Listen("unix", grpcSock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	go gs.Serve(l)
	defer gs.Stop()
	hangUp := serve(t, func(c net.Conn) {
		io.ReadFull(c, make([]byte, len(RequestMagic)))
	})
	cases := []struct {
		name, sock, cmd, conf string
		code                  int
		version, msg          string
	}{
		{"absent", filepath.Join(t.TempDir(), "none.sock"), "ADD", `{"cniVersion":"0.4.0","name":"n"}`, 11, "0.4.0", "cannot reach skeind"},
		{"absent, status", filepath.Join(t.TempDir(), "none.sock"), "STATUS", `{"cniVersion":"1.1.0","name":"n"}`, 50, "1.1.0", "cannot reach skeind"},
		{"absent, no version", filepath.Join(t.TempDir(), "none.sock"), "DEL", `{"name":"n"}`, 11, "0.1.0", "cannot reach skeind"},
		{"absent, bad config", filepath.Join(t.TempDir(), "none.sock"), "DEL", `{"name":`, 6, cnispec.Newest, "not valid JSON"},
		{"older skeind", grpcSock, "ADD", `{"cniVersion":"1.0.0","name":"n"}`, 11, "1.0.0", "does not answer this plugin's calls"},
		{"hangs up", hangUp, "ADD", `{"cniVersion":"1.0.0","name":"n"}`, 11, "1.0.0", "closed the connection without an answer"},
	}
	for _, c := range cases {
		env := map[string]string{"CNI_COMMAND": c.cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "SKEIN_SOCKET": c.sock}
		exit, stdout, _ := runPlugin(env, c.conf)
		e := decodeErr(t, exit, stdout)
		if e.Code != c.code || e.CNIVersion != c.version || !strings.Contains(e.Msg, c.msg) || e.Details == "" {
			t.Errorf("%s: %+v, want code %d in %s saying %q", c.name, e, c.code, c.version, c.msg)
		}
	}
}

// TestRunLocal: VERSION and the "about" lines need no skeind and print
// what skel prints.
func TestRunLocal(t *testing.T) {
	exit, stdout, _ := runPlugin(map[string]string{"CNI_COMMAND": "VERSION", "SKEIN_SOCKET": "/nonexistent"}, "")
	want, _ := json.Marshal(map[string]any{"cniVersion": cnispec.Newest, "supportedVersions": cnispec.Versions})
	if exit != 0 || stdout != string(want)+"\n" {
		t.Errorf("VERSION: exit %d %q, want %s", exit, stdout, want)
	}
	exit, stdout, stderr := runPlugin(map[string]string{}, "")
	if exit != 0 || stdout != "" || stderr != "skein CNI plugin test\nCNI protocol versions supported: "+strings.Join(cnispec.Versions, ", ")+"\n" {
		t.Errorf("about: exit %d stdout %q stderr %q", exit, stdout, stderr)
	}
}

// TestQuote: error messages are JSON strings whatever they hold.
func TestQuote(t *testing.T) {
	for _, s := range []string{"", "plain", `a"b\c`, "tab\tnl\n\x01", "é😀", "bad \xff utf-8", "</script>"} {
		var back string
		if err := json.Unmarshal(quote(nil, s), &back); err != nil || back != strings.ToValidUTF8(s, "\uFFFD") {
			t.Errorf("quote(%q) = %s: decodes to %q, %v", s, quote(nil, s), back, err)
		}
	}
}

// TestWireLimits: a request over a limit is refused whole.
func TestWireLimits(t *testing.T) {
	ok := Request{Service: "s", Env: []string{"CNI_COMMAND=ADD"}, Stdin: []byte("{}")}
	b := AppendRequest(nil, ok)[len(RequestMagic):]
	if r, err := ReadRequest(bytes.NewReader(b)); err != nil || r.Service != "s" || string(r.Stdin) != "{}" || len(r.Env) != 1 {
		t.Fatalf("round trip: %+v, %v", r, err)
	}
	for name, r := range map[string]Request{
		"service": {Service: strings.Repeat("s", MaxService+1)},
		"env":     {Service: "s", Env: make([]string, MaxEnv+1)},
		"stdin":   {Service: "s", Stdin: make([]byte, MaxStdin+1)},
	} {
		if _, err := ReadRequest(bytes.NewReader(AppendRequest(nil, r)[len(RequestMagic):])); err != ErrFrame {
			t.Errorf("%s over its limit: %v, want ErrFrame", name, err)
		}
	}
	if _, err := ReadRequest(bytes.NewReader(b[:len(b)-1])); err == nil {
		t.Error("a request cut short was read")
	}
	if _, err := ParseReply(AppendReply(nil, Reply{Stdout: []byte("x")})[:len(ReplyMagic)+5]); err != ErrFrame {
		t.Errorf("a reply cut short: %v", err)
	}
}

// FuzzReadRequest: whatever follows the magic is refused or read as a
// request within the limits whose frame is exactly the bytes read.
func FuzzReadRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{TimeoutMS: 60000, Service: "skein.v1.CNI", Env: []string{"CNI_COMMAND=ADD"}, Stdin: []byte(`{"name":"n"}`)})[len(RequestMagic):])
	f.Add(make([]byte, 40))
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		req, err := ReadRequest(r)
		if err != nil {
			return
		}
		used := in[:len(in)-r.Len()]
		if again := AppendRequest(nil, req)[len(RequestMagic):]; !bytes.Equal(again, used) {
			t.Fatalf("read %+v from %q, which frames as %q", req, used, again)
		}
		if len(req.Service) > MaxService || len(req.Env) > MaxEnv || len(req.Stdin) > MaxStdin {
			t.Fatalf("accepted a request over the limits: %d-byte service, %d variables, %d bytes of stdin", len(req.Service), len(req.Env), len(req.Stdin))
		}
	})
}
