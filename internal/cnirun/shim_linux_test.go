package cnirun

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The skein binary runtimes exec is C (cmd/skein/skein.c): a fast path
// that hands a well-formed call to skeind and execs skein-cni (this
// package's binary) for everything else. These tests run both binaries
// built from this checkout side by side: whatever the C binary does, the
// runtime must see what skein-cni alone would have given it.

var (
	shimOnce sync.Once
	shimDirs struct{ normal, quick string }
	shimErr  error
)

// shims builds skein-cni and the C skein next to it (normal), and a C
// skein whose call times out after 300 ms beside the same skein-cni
// (quick).
func shims(t *testing.T) (normal, quick string) {
	t.Helper()
	shimOnce.Do(func() {
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		if _, err := exec.LookPath(cc); err != nil {
			shimErr = errNoCC
			return
		}
		root, err := os.MkdirTemp("", "skein-shim-")
		if err != nil {
			shimErr = err
			return
		}
		shimDirs.normal, shimDirs.quick = filepath.Join(root, "normal"), filepath.Join(root, "quick")
		for _, d := range []string{shimDirs.normal, shimDirs.quick} {
			if shimErr = os.Mkdir(d, 0o755); shimErr != nil {
				return
			}
		}
		run := func(name string, args ...string) {
			if shimErr != nil {
				return
			}
			cmd := exec.Command(name, args...)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				shimErr = errors.New(name + ": " + err.Error() + "\n" + string(out))
			}
		}
		run("go", "build", "-trimpath", "-o", filepath.Join(shimDirs.normal, "skein-cni"), "../../cmd/skein-cni")
		run(cc, "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o", filepath.Join(shimDirs.normal, "skein"), "../../cmd/skein/skein.c")
		run(cc, "-O2", "-static", "-DCALL_TIMEOUT_MS=300", "-o", filepath.Join(shimDirs.quick, "skein"), "../../cmd/skein/skein.c")
		if shimErr == nil {
			shimErr = os.Symlink(filepath.Join(shimDirs.normal, "skein-cni"), filepath.Join(shimDirs.quick, "skein-cni"))
		}
	})
	if shimErr == errNoCC {
		t.Skip("no C compiler (cc, or $CC): bin/skein cannot be built here (Debian: gcc libc6-dev)")
	}
	if shimErr != nil {
		t.Fatal(shimErr)
	}
	return shimDirs.normal, shimDirs.quick
}

var errNoCC = errors.New("no C compiler")

// alone copies the C binary of dir into a directory without skein-cni.
func alone(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	b, err := os.ReadFile(filepath.Join(dir, "skein"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "skein"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

type execResult struct {
	exit           int
	stdout, stderr string
}

func execBin(t *testing.T, bin string, env []string, stdin string) execResult {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s: %v", bin, err)
	}
	return execResult{cmd.ProcessState.ExitCode(), out.String(), errOut.String()}
}

// recorder is a skeind stand-in on a socket of its own: it reads each
// request and answers with answer, or does what act does instead.
type recorder struct {
	sock string
	mu   sync.Mutex
	reqs []Request
}

func newRecorder(t *testing.T, act func(c net.Conn, br *bufio.Reader, r *recorder)) *recorder {
	r := &recorder{}
	r.sock = serve(t, func(c net.Conn) { act(c, bufio.NewReader(c), r) })
	return r
}

func (r *recorder) read(c net.Conn, br *bufio.Reader) (Request, bool) {
	magic := make([]byte, len(RequestMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != RequestMagic {
		return Request{}, false
	}
	req, err := ReadRequest(br)
	if err != nil {
		return Request{}, false
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return req, true
}

func (r *recorder) taken() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// answering replies with its name and exit status 3.
func answering(name string) func(c net.Conn, br *bufio.Reader, r *recorder) {
	return func(c net.Conn, br *bufio.Reader, r *recorder) {
		if _, ok := r.read(c, br); ok {
			c.Write(AppendReply(nil, Reply{Exit: 3, Stdout: []byte(name)}))
		}
	}
}

func cniEnv(cmd string, extra ...string) []string {
	return append([]string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=c1", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0",
		"CNI_PATH=/opt/cni/bin", "HOME=/root"}, extra...)
}

// TestShimHandsOverLikeGo: the C binary sends skeind the same request as
// skein-cni, byte for byte once decoded, and prints and exits with the
// answer; it needs no skein-cni for that.
func TestShimHandsOverLikeGo(t *testing.T) {
	normal, _ := shims(t)
	rec := newRecorder(t, answering("printed"))
	conf := `{"cniVersion":"1.0.0","name":"n","socket":"` + rec.sock + `","ipam":{"type":"x","ranges":[[{"subnet":"10.0.0.0/24"}]]},"mtu":1400,"f":-1.5e+3,"t":true,"z":null}`
	env := cniEnv("ADD", "CNI_ARGS=K8S_POD_NAME=p;K8S_POD_NAMESPACE=n", "SKEIN_SOCKET=/elsewhere.sock")

	alone := alone(t, normal)
	var reqs []Request
	for _, bin := range []string{filepath.Join(normal, "skein-cni"), filepath.Join(normal, "skein"), filepath.Join(alone, "skein")} {
		got := execBin(t, bin, env, conf)
		if got.exit != 3 || got.stdout != "printed" || got.stderr != "" {
			t.Fatalf("%s: %+v, want skeind's exit 3 and \"printed\"", bin, got)
		}
		taken := rec.taken()
		if len(taken) != 1 {
			t.Fatalf("%s: skeind got %d requests, want 1", bin, len(taken))
		}
		reqs = append(reqs, taken[0])
	}
	for i, r := range reqs[1:] {
		if !sameRequest(r, reqs[0]) {
			t.Errorf("request %d of the C binary\n%+v\nskein-cni's\n%+v", i, r, reqs[0])
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if own := (NSID{st.Dev, st.Ino}); reqs[1].SelfNS != own || reqs[1].PodNS != own || reqs[1].TimeoutMS != 60000 || reqs[1].Service != "skein.v1.CNI" {
		t.Errorf("C binary's request: %+v", reqs[1])
	}
}

func sameRequest(a, b Request) bool {
	return a.TimeoutMS == b.TimeoutMS && a.SelfNS == b.SelfNS && a.PodNS == b.PodNS && a.Service == b.Service &&
		slices.Equal(a.Env, b.Env) && bytes.Equal(a.Stdin, b.Stdin)
}

// TestShimFindsSocketLikeGo: whichever configuration, the C binary calls
// the skeind skein-cni calls ("socket" as encoding/json reads it, else
// $SKEIN_SOCKET): it reads the plain cases itself and leaves the rest to
// skein-cni, which the test cannot tell from outside, and must not.
func TestShimFindsSocketLikeGo(t *testing.T) {
	normal, _ := shims(t)
	env := newRecorder(t, answering("env"))
	conf := newRecorder(t, answering("conf"))
	other := newRecorder(t, answering("other"))
	q := func(s string) string { return `"` + s + `"` }
	escaped := strings.ReplaceAll(conf.sock, "/", `\/`)
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	cases := []struct {
		name, conf, want string
	}{
		{"plain", `{"cniVersion":"1.0.0","socket":` + q(conf.sock) + `}`, "conf"},
		{"upper case", `{"SOCKET":` + q(conf.sock) + `}`, "conf"},
		{"long s", `{"ſocket":` + q(conf.sock) + `}`, "conf"},
		{"kelvin", `{"soc` + "\u212a" + `et":` + q(conf.sock) + `}`, "conf"},
		{"escaped name", `{"\u0073ocket":` + q(conf.sock) + `}`, "conf"},
		{"escaped value", `{"socket":"` + escaped + `"}`, "conf"},
		{"null", `{"socket":null}`, "env"},
		{"empty", `{"socket":""}`, "env"},
		{"none", `{"cniVersion":"1.0.0","name":"n"}`, "env"},
		{"nested", `{"ipam":{"socket":` + q(conf.sock) + `}}`, "env"},
		{"twice", `{"socket":` + q(conf.sock) + `,"Socket":` + q(other.sock) + `}`, "other"},
		{"then null", `{"socket":` + q(conf.sock) + `,"socket":null}`, "conf"},
		{"number", `{"socket":5}`, "env"},
		{"number after", `{"socket":` + q(conf.sock) + `,"socket":5}`, "conf"},
		{"values around", ` {"a":[1,-0.5,2e10,{"b":"c\"d"}],"t":true,"f":false,"n":null,"socket":` + q(conf.sock) + `,"x":{}} ` + "\n", "conf"},
		{"deep", `{"d":` + deep + `,"socket":` + q(conf.sock) + `}`, "conf"},
		{"not JSON", `{"socket":` + q(conf.sock), "env"},
		{"trailing", `{"socket":` + q(conf.sock) + `} x`, "env"},
		{"top null", `null`, "env"},
		{"array", `[1]`, "env"},
		{"empty stdin", ``, "env"},
		{"control in value", `{"socket":"` + conf.sock + "\x01" + `"}`, "env"},
		{"non-ASCII value", `{"socket":"` + conf.sock + `é"}`, "none"},
	}
	for _, c := range cases {
		var outs []execResult
		for _, bin := range []string{"skein-cni", "skein"} {
			got := execBin(t, filepath.Join(normal, bin), cniEnv("ADD", "SKEIN_SOCKET="+env.sock), c.conf)
			outs = append(outs, got)
			reached := ""
			for _, r := range []*recorder{env, conf, other} {
				for range r.taken() {
					reached += got.stdout
				}
			}
			if c.want == "none" {
				if reached != "" || got.exit != 1 {
					t.Errorf("%s, %s: reached %q, exit %d; want no skeind reached", c.name, bin, reached, got.exit)
				}
			} else if reached != c.want || got.exit != 3 {
				t.Errorf("%s, %s: reached %q (exit %d, %q), want %q", c.name, bin, reached, got.exit, got.stdout, c.want)
			}
		}
		if outs[0] != outs[1] {
			t.Errorf("%s: skein-cni gave %+v, the C binary %+v", c.name, outs[0], outs[1])
		}
	}
}

// TestShimErrorsLikeGo: what goes wrong reaches the runtime in skein-cni's
// words, exit status and stderr, whether it went wrong before the request
// was sent (skein-cni then tries itself) or after (skein-cni only words
// it: the request is never sent twice).
func TestShimErrorsLikeGo(t *testing.T) {
	normal, quick := shims(t)
	hangUp := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) { r.read(c, br) })
	// Closed with the request unread: the binary's read sees a reset.
	reset := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		time.Sleep(50 * time.Millisecond)
		r.mu.Lock()
		r.reqs = append(r.reqs, Request{})
		r.mu.Unlock()
	})
	garbage := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		if _, ok := r.read(c, br); ok {
			c.Write([]byte("\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage"))
		}
	})
	short := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		if _, ok := r.read(c, br); ok {
			c.Write(AppendReply(nil, Reply{Exit: 0, Stdout: []byte("cut")})[:len(ReplyMagic)+6])
		}
	})
	long := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		if _, ok := r.read(c, br); ok {
			c.Write(bytes.Repeat([]byte("x"), MaxStdout+len(ReplyMagic)+4096))
		}
	})
	absent := filepath.Join(t.TempDir(), "none.sock")
	conf := func(sock string) string { return `{"cniVersion":"0.4.0","name":"n","socket":"` + sock + `"}` }
	cases := []struct {
		name, cmd, conf string
		env             []string
		sends           *recorder // the request must reach it once per binary
	}{
		{"absent", "ADD", conf(absent), nil, nil},
		{"absent, status", "STATUS", conf(absent), nil, nil},
		{"absent, bad config", "DEL", `{"name":`, []string{"SKEIN_SOCKET=" + absent}, nil},
		{"absent, no version", "DEL", `{"name":"n","socket":"` + absent + `"}`, nil, nil},
		{"hangs up", "ADD", conf(hangUp.sock), nil, hangUp},
		{"resets", "DEL", conf(reset.sock), nil, reset},
		{"not our answer", "ADD", conf(garbage.sock), nil, garbage},
		{"answer cut short", "CHECK", conf(short.sock), nil, short},
		{"answer too long", "ADD", conf(long.sock), nil, long},
		{"stdin too long", "ADD", conf(absent) + strings.Repeat(" ", MaxStdin), nil, nil},
		{"variable too long", "ADD", conf(hangUp.sock), []string{"CNI_ARGS=" + strings.Repeat("a", 1<<16)}, nil},
		{"socket path too long", "ADD", conf("/" + strings.Repeat("s", 200)), nil, nil},
		{"abstract socket", "ADD", conf("@skein-test-none"), nil, nil},
		{"version", "VERSION", "", nil, nil},
		{"about", "", "", nil, nil},
	}
	for _, c := range cases {
		env := append(cniEnv(c.cmd), c.env...)
		if c.cmd == "" {
			env = []string{} // not nil: exec.Cmd would pass on this process's
		}
		var outs []execResult
		for _, bin := range []string{"skein-cni", "skein"} {
			got := execBin(t, filepath.Join(normal, bin), env, c.conf)
			outs = append(outs, got)
			if c.sends != nil {
				if n := len(c.sends.taken()); n != 1 {
					t.Errorf("%s, %s: the request was sent %d times, want once", c.name, bin, n)
				}
			}
		}
		if outs[0] != outs[1] {
			t.Errorf("%s: skein-cni gave %+v\nthe C binary %+v", c.name, outs[0], outs[1])
		}
		if c.cmd != "VERSION" && c.cmd != "" && (outs[1].exit != 1 || !strings.Contains(outs[1].stdout, `"code"`)) {
			t.Errorf("%s: %+v, want a spec error", c.name, outs[1])
		}
	}

	// A skeind that never answers: the call's own timeout (300 ms in this
	// build), then skein-cni's words for it, the request sent once.
	silent := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		r.read(c, br)
		time.Sleep(5 * time.Second)
	})
	start := time.Now()
	got := execBin(t, filepath.Join(quick, "skein"), cniEnv("ADD"), conf(silent.sock))
	if took := time.Since(start); took > 4*time.Second || got.exit != 1 || !strings.Contains(got.stdout, "did not answer ADD") || len(silent.taken()) != 1 {
		t.Errorf("silent skeind: %+v after %v, want a timeout error after ~300 ms and one request", got, took)
	}
}

// TestShimWithoutFallback: a C binary installed without skein-cni next to
// it says so in a spec error when it needs it.
func TestShimWithoutFallback(t *testing.T) {
	normal, _ := shims(t)
	alone := alone(t, normal)
	for _, cmd := range []string{"ADD", "VERSION"} {
		got := execBin(t, filepath.Join(alone, "skein"), cniEnv(cmd), `{"cniVersion":"1.0.0","name":"n","socket":"/nonexistent.sock"}`)
		e := decodeErr(t, got.exit, got.stdout)
		if e.Code != 11 || !strings.Contains(e.Msg, "skein-cni") || !strings.Contains(e.Details, filepath.Join(alone, "skein-cni")) {
			t.Errorf("%s without skein-cni: %+v", cmd, e)
		}
	}
}

// TestFailure: the failures the C binary hands over, and no other string,
// are errors skein-cni words without calling.
func TestFailure(t *testing.T) {
	for what, want := range map[string]error{
		"noanswer": errNoAnswer, "timeout": syscall.EAGAIN, "frame": ErrFrame, "nomem": syscall.ENOMEM,
		"errno:104": syscall.ECONNRESET, "errno:0": syscall.EIO, "errno:x": syscall.EIO, "": syscall.EIO, "other": syscall.EIO,
		"stdin:x": syscall.EIO,
	} {
		if got := failure(what); got != want {
			t.Errorf("failure(%q) = %v, want %v", what, got, want)
		}
	}
	if f, ok := failure("stdin:5").(stdinFailure); !ok || !errors.Is(f.err, syscall.EIO) || f.Error() != "read /dev/stdin: input/output error" {
		t.Errorf("failure(stdin:5) = %v", failure("stdin:5"))
	}
}

// TestShimOddDescriptors: what a runtime may hand a plugin that Go's
// os.Stdin and os.Stdout take in their stride, the C binary must too: a
// non-blocking stdin whose configuration arrives in two writes, a closed
// stdout, a non-blocking stdout smaller than the answer.
func TestShimOddDescriptors(t *testing.T) {
	normal, _ := shims(t)
	big := strings.Repeat("r", 300<<10) // larger than a pipe's buffer
	rec := newRecorder(t, func(c net.Conn, br *bufio.Reader, r *recorder) {
		if req, ok := r.read(c, br); ok {
			out := "printed"
			if req.Getenv("CNI_COMMAND") == "CHECK" {
				out = big
			}
			c.Write(AppendReply(nil, Reply{Exit: 3, Stdout: []byte(out)}))
		}
	})
	conf := `{"cniVersion":"1.0.0","name":"n","socket":"` + rec.sock + `","pad":"` + strings.Repeat("p", 200) + `"}`
	// run starts bin with stdin and stdout as given (raw descriptors,
	// their flags kept), writes the rest of stdin after a pause, and
	// returns the exit status and what stdout got.
	run := func(bin, verb string, nonblockOut bool) (int, string) {
		t.Helper()
		var in [2]int
		if err := syscall.Pipe2(in[:], syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		if err := syscall.SetNonblock(in[0], true); err != nil {
			t.Fatal(err)
		}
		var out [2]int
		if err := syscall.Pipe2(out[:], syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		if nonblockOut {
			syscall.SetNonblock(out[1], true)
		}
		syscall.Write(in[1], []byte(conf[:100]))
		pid, err := syscall.ForkExec(bin, []string{bin}, &syscall.ProcAttr{Env: cniEnv(verb), Files: []uintptr{uintptr(in[0]), uintptr(out[1]), 2}})
		if err != nil {
			t.Fatal(err)
		}
		syscall.Close(in[0])
		syscall.Close(out[1])
		time.Sleep(200 * time.Millisecond)
		syscall.Write(in[1], []byte(conf[100:]))
		syscall.Close(in[1])
		got, _ := io.ReadAll(os.NewFile(uintptr(out[0]), "stdout"))
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		return ws.ExitStatus(), string(got)
	}
	for _, bin := range []string{"skein-cni", "skein"} {
		path := filepath.Join(normal, bin)
		if exit, got := run(path, "ADD", false); exit != 3 || got != "printed" || len(rec.taken()) != 1 {
			t.Errorf("%s, stdin non-blocking and in two parts: exit %d, %.80q", bin, exit, got)
		}
		if exit, got := run(path, "CHECK", true); exit != 3 || got != big || len(rec.taken()) != 1 {
			t.Errorf("%s, a 300 KiB answer on a non-blocking stdout: exit %d, %d bytes", bin, exit, len(got))
		}
		cmd := exec.Command("/bin/sh", "-c", `exec "$0" >&-`, path)
		cmd.Env = cniEnv("ADD")
		cmd.Stdin = strings.NewReader(conf)
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 || len(rec.taken()) != 1 {
			t.Errorf("%s with stdout closed: %v, want skeind's exit status 3", bin, err)
		}
	}
}

// TestShimLongStdin: a configuration over the limit is refused in
// skein-cni's words, its cniVersion read from the whole of it.
func TestShimLongStdin(t *testing.T) {
	normal, _ := shims(t)
	conf := `{"name":"n","socket":"/nonexistent.sock","pad":"` + strings.Repeat("x", MaxStdin+300000) + `","cniVersion":"0.4.0"}`
	var outs []execResult
	for _, bin := range []string{"skein-cni", "skein"} {
		outs = append(outs, execBin(t, filepath.Join(normal, bin), cniEnv("ADD"), conf))
	}
	if outs[0] != outs[1] || !strings.Contains(outs[1].stdout, `"cniVersion": "0.4.0"`) {
		t.Errorf("skein-cni gave %+v\nthe C binary %+v", outs[0], outs[1])
	}
}
