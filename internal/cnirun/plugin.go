// Package cnirun is the skein CNI binaries' side of their call to skeind,
// and the whole of those binaries: a runtime execs one for every ADD and
// DEL, and most of what it costs is the process's start, which grows with
// each package the binary links. So the binary does next to nothing: it
// reads stdin, stats two namespaces and hands the CNI_ variables and
// stdin to skeind in one frame (wire.go); skeind checks them as the CNI
// library's skel would, runs the verb and answers what the binary prints
// and its exit status (internal/cniplugin). Locally it answers only what
// needs no skeind: VERSION, the "about" lines, and a spec error when skeind
// cannot be reached. It links os and syscall and nothing the Go runtime
// does not already start (cmd/skein's imports_test.go keeps it so).
package cnirun

import (
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/skeinnet/skein/internal/cnispec"
)

// DefaultSocket is where skeind listens unless the network configuration's
// "socket" or $SKEIN_SOCKET says otherwise.
const DefaultSocket = "/run/skein/skeind.sock"

// CallTimeout bounds one call; skeind is told it and gives up first.
const CallTimeout = 60 * time.Second

// A second on top of CallTimeout for skeind's own answer to arrive.
const callGrace = time.Second

// Plugin describes one plugin binary.
type Plugin struct {
	Service string // skeind's service, "skein.v1.CNI"
	About   string // the first "about" line, "skein CNI plugin v1"

	// failed, when set, is how the call already failed (FailedFlag):
	// the binary words it and does not call.
	failed error
}

// Spec error codes the binary gives itself.
const (
	errInvalidEnvironment = 4
	errIOFailure          = 5
	errDecodingFailure    = 6
	errTryAgainLater      = 11
	errPluginNotAvailable = 50
)

// Main runs the binary and exits.
func Main(p Plugin) {
	if len(os.Args) == 2 && len(os.Args[1]) > len(FailedFlag) && os.Args[1][:len(FailedFlag)] == FailedFlag {
		p.failed = failure(os.Args[1][len(FailedFlag):])
	}
	os.Exit(p.run(os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// FailedFlag is how the skein binary (cmd/skein, in C) hands skein-cni a
// call that failed after its request was sent, as its only argument:
// FailedFlag + "noanswer", "timeout", "frame", "nomem", "errno:N", or
// "stdin:N" (reading stdin failed with errno N after part of it).
// skein-cni then words the error with stdin as the configuration and
// never sends the request again (skeind may have run it).
const FailedFlag = "--skein-failed="

// failure is the error a FailedFlag names; an unknown one is still a
// failure (EIO), never a reason to call.
func failure(what string) error {
	switch what {
	case "noanswer":
		return errNoAnswer
	case "timeout":
		return syscall.EAGAIN
	case "frame":
		return ErrFrame
	case "nomem":
		return syscall.ENOMEM
	}
	if len(what) > 6 && what[:6] == "errno:" {
		if n, err := strconv.Atoi(what[6:]); err == nil && n > 0 {
			return syscall.Errno(n)
		}
	}
	if len(what) > 6 && what[:6] == "stdin:" {
		if n, err := strconv.Atoi(what[6:]); err == nil && n > 0 {
			return stdinFailure{&os.PathError{Op: "read", Path: "/dev/stdin", Err: syscall.Errno(n)}}
		}
	}
	return syscall.EIO
}

// stdinFailure is the C binary's failed read of stdin, after part of it
// (which it replays): skein-cni reports it as its own read's failure.
type stdinFailure struct{ err error }

func (f stdinFailure) Error() string { return f.err.Error() }

// env are the variables skeind is sent.
var env = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

func (p Plugin) run(getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := getenv("CNI_COMMAND")
	switch cmd {
	case "":
		io.WriteString(stderr, p.About+"\nCNI protocol versions supported: "+join(cnispec.Versions, ", ", "")+"\n")
		return 0
	case "VERSION":
		_, err := io.WriteString(stdout, `{"cniVersion":"`+cnispec.Newest+`","supportedVersions":[`+join(cnispec.Versions, ",", `"`)+"]}\n")
		if err != nil {
			return 1
		}
		return 0
	}
	data, err := io.ReadAll(stdin)
	if sf, ok := p.failed.(stdinFailure); ok && err == nil {
		err = sf.err // the C binary's read of the runtime's stdin failed
	}
	if err != nil {
		return printError(stdout, "", errIOFailure, "error reading from stdin: "+err.Error(), "")
	}
	if len(data) > MaxStdin {
		return printError(stdout, versionOf(data), errIOFailure, "the network configuration is longer than "+strconv.Itoa(MaxStdin)+" bytes", "")
	}
	req := Request{TimeoutMS: uint32(CallTimeout.Milliseconds()), Service: p.Service, Stdin: data}
	for _, name := range env {
		if v := getenv(name); v != "" {
			kv := name + "=" + v
			if len(kv) > maxEnvFrame {
				return printError(stdout, versionOf(data), errInvalidEnvironment, name+" is longer than "+strconv.Itoa(maxEnvFrame-len(name)-1)+" bytes", "")
			}
			req.Env = append(req.Env, kv)
		}
	}
	req.SelfNS = nsID("/proc/thread-self/ns/net")
	if path := getenv("CNI_NETNS"); path != "" {
		req.PodNS = nsID(path)
	}
	sock, _ := configString(data, "socket")
	if sock == "" {
		sock = getenv("SKEIN_SOCKET")
	}
	if sock == "" {
		sock = DefaultSocket
	}
	var out []byte
	err = p.failed
	if err == nil {
		out, err = call(sock, AppendRequest(nil, req))
	}
	if err == nil {
		var rep Reply
		if rep, err = ParseReply(out); err == nil {
			if _, err := stdout.Write(rep.Stdout); err != nil {
				return 1
			}
			return int(rep.Exit)
		}
	}
	if !valid(data) {
		// skeind would have said so, in encoding/json's words; without it
		// the configuration is still the first thing wrong.
		return printError(stdout, "", errDecodingFailure, "error unmarshall network config: not valid JSON", "skeind, which would have said where, cannot be reached: "+err.Error())
	}
	code := errTryAgainLater
	if cmd == "STATUS" {
		code = errPluginNotAvailable
	}
	msg := "cannot reach skeind at " + sock + ": is it running?"
	switch {
	case err == errNoAnswer:
		msg = "skeind at " + sock + " closed the connection without an answer"
	case err == syscall.EAGAIN:
		msg = "skeind did not answer " + cmd + " within " + CallTimeout.String()
	case err == ErrFrame:
		msg = "skeind at " + sock + " does not answer this plugin's calls (" + RequestMagic[:len(RequestMagic)-1] + "): is it older than the plugin?"
	}
	return printError(stdout, versionOf(data), code, msg, err.Error())
}

// errNoAnswer: the connection ended before any byte of an answer.
var errNoAnswer = syscall.ECONNRESET

// call sends req on a new connection to sock and reads the answer to its
// end, within the call's timeout (an EAGAIN is a timeout). The connect
// blocks (SO_SNDTIMEO); the rest waits in Go's poller: a goroutine parked
// there leaves the process no running P, so the runtime's sysmon thread
// sleeps until the answer comes, where during a blocking read it would
// wake every 20 µs to 10 ms — ~60 wake-ups during a DEL that waits 15 ms
// for the kernel, most of the binary's CPU beyond any Go program's start
// (measured: docs/benchmarks/report.md).
func call(sock string, req []byte) ([]byte, error) {
	deadline := time.Now().Add(CallTimeout + callGrace)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tv := syscall.NsecToTimeval(int64(CallTimeout + callGrace))
	syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv)
	interrupted := false
	err = retry(func() error {
		err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: sock})
		if err == syscall.EISCONN && interrupted {
			return nil // the interrupted connect went on and completed
		}
		interrupted = err == syscall.EINTR
		return err
	})
	if err == nil {
		err = syscall.SetNonblock(fd, true)
	}
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	conn := os.NewFile(uintptr(fd), sock) // non-blocking: served by the poller
	defer conn.Close()
	conn.SetDeadline(deadline)
	if _, err := conn.Write(req); err != nil {
		return nil, errnoOf(err)
	}
	out := make([]byte, 0, 4096)
	for {
		if len(out) == cap(out) {
			if len(out) > MaxStdout+len(ReplyMagic)+5 {
				return nil, ErrFrame
			}
			out = append(out, 0)[:len(out)]
		}
		n, err := conn.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			if len(out) == 0 {
				return nil, errNoAnswer
			}
			return out, nil
		}
		switch err = errnoOf(err); {
		case err == syscall.ECONNRESET && len(out) == 0:
			return nil, errNoAnswer
		case err == syscall.ECONNRESET && !isPrefix(out, ReplyMagic):
			return nil, ErrFrame // an older skeind's gRPC server, refusing our bytes
		case err != nil:
			return nil, err
		}
	}
}

// errnoOf is the errno behind an os.File error (syscall.EAGAIN for its
// deadline), err itself otherwise.
func errnoOf(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if err == os.ErrDeadlineExceeded {
		return syscall.EAGAIN
	}
	return err
}

// retry repeats f while a signal interrupts it: the Go runtime's signals
// interrupt a socket call that has a timeout even with SA_RESTART.
func retry(f func() error) error {
	for {
		if err := f(); err != syscall.EINTR {
			return err
		}
	}
}

func isPrefix(b []byte, magic string) bool {
	n := min(len(b), len(magic))
	return string(b[:n]) == magic[:n]
}

// nsID stats a namespace file; zero when it cannot.
func nsID(path string) NSID {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return NSID{}
	}
	return NSID{Dev: st.Dev, Ino: st.Ino}
}

// versionOf is the version a local error is reported in: the
// configuration's; one that decodes but names none is 0.1.0; "" when it
// does not decode.
func versionOf(conf []byte) string {
	v, bad := configString(conf, "cniVersion")
	switch {
	case bad:
		return ""
	case v == "":
		return "0.1.0"
	}
	return v
}

// printError writes the spec's error object, in the configuration's
// version (the newest skein speaks when it has none), and returns the
// exit status 1.
func printError(w io.Writer, version string, code int, msg, details string) int {
	if version == "" {
		version = cnispec.Newest
	}
	b := []byte("{\n    \"cniVersion\": ")
	b = quote(b, version)
	b = append(b, ",\n    \"code\": "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ",\n    \"msg\": "...)
	b = quote(b, msg)
	if details != "" {
		b = append(b, ",\n    \"details\": "...)
		b = quote(b, details)
	}
	w.Write(append(b, "\n}\n"...))
	return 1
}

// quote appends s as a JSON string.
func quote(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s { // invalid UTF-8 comes as U+FFFD
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[r>>4], "0123456789abcdef"[r&15])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

func join(list []string, sep, q string) string {
	s := ""
	for i, v := range list {
		if i > 0 {
			s += sep
		}
		s += q + v + q
	}
	return s
}
