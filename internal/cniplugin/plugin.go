package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/skeinnet/skein/internal/cniclient"
)

// DefaultSocket is where skeind listens unless the network config's
// "socket" or $SKEIN_SOCKET says otherwise.
const DefaultSocket = "/run/skein/skeind.sock"

// CallTimeout bounds one request; a runtime's own timeout is usually longer.
const CallTimeout = 60 * time.Second

// Plugin describes one plugin binary.
type Plugin struct {
	// Service is skeind's gRPC service, e.g. "skein.v1.CNI".
	Service string
	// About is the line printed without CNI_COMMAND, e.g. "skein CNI plugin v1".
	About string
	// Unimplemented is the message when skeind lacks Service ("" = a
	// generic one).
	Unimplemented string
}

// Main runs the plugin and exits.
func Main(p Plugin) {
	confVersion := ""
	stdin := io.Reader(os.Stdin)
	if os.Getenv("CNI_COMMAND") != "" {
		// Read ahead so that an error can carry the configuration's
		// cniVersion, as the spec's error format asks. Without
		// CNI_COMMAND only the "about" lines are printed.
		data, err := io.ReadAll(os.Stdin)
		if err == nil {
			confVersion = versionOf(data)
		}
		stdin = &readResult{data: data, err: err}
	}
	if e := dispatch(os.Getenv, stdin, os.Stdout, os.Stderr, Verbs{
		Add:    p.call("ADD"),
		Del:    p.call("DEL"),
		Check:  p.call("CHECK"),
		GC:     p.call("GC"),
		Status: p.call("STATUS"),
	}, p.About); e != nil {
		printError(confVersion, e)
		os.Exit(1)
	}
}

// readResult replays what reading stdin gave: the bytes, then its error.
type readResult struct {
	data []byte
	err  error
}

func (r *readResult) Read(b []byte) (int, error) {
	if len(r.data) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(b, r.data)
	r.data = r.data[n:]
	return n, nil
}

// versionOf is the version an error is reported in: the configuration's;
// a configuration that decodes but names none is 0.1.0; "" means it could
// not be read.
func versionOf(conf []byte) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if json.Unmarshal(conf, &c) != nil {
		return ""
	}
	if c.CNIVersion == "" {
		return "0.1.0"
	}
	return c.CNIVersion
}

// printError writes the spec's error object to stdout. When the
// configuration gave no version (it could not be decoded) the newest one
// skein speaks is named.
func printError(confVersion string, e *Error) {
	if confVersion == "" {
		confVersion = "1.1.0"
	}
	out, _ := json.MarshalIndent(struct {
		CNIVersion string `json:"cniVersion"`
		Code       uint   `json:"code"`
		Msg        string `json:"msg"`
		Details    string `json:"details,omitempty"`
	}{confVersion, e.Code, e.Msg, e.Details}, "", "    ")
	_, _ = os.Stdout.Write(append(out, '\n'))
}

// SocketPath picks skeind's socket for a request.
func SocketPath(stdin []byte) string {
	var c struct {
		Socket string `json:"socket"`
	}
	_ = json.Unmarshal(stdin, &c) // dispatch already rejected undecodable input
	if c.Socket != "" {
		return c.Socket
	}
	if s := os.Getenv("SKEIN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// methods maps CNI verbs onto the services' methods.
var methods = map[string]string{"ADD": "Add", "DEL": "Del", "CHECK": "Check", "GC": "GC", "STATUS": "Status"}

func (p Plugin) call(verb string) func(*Args) error {
	return func(args *Args) error {
		if verb == "ADD" || verb == "CHECK" {
			if err := notOwnNetNS(args.Netns); err != nil {
				return err
			}
		}
		sock := SocketPath(args.StdinData)
		ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
		defer cancel()
		reply, err := cniclient.CallService(ctx, sock, p.Service, methods[verb], cniclient.Request{
			ContainerID: args.ContainerID,
			NetNS:       args.Netns,
			IfName:      args.IfName,
			Args:        args.Args,
			Path:        args.Path,
			NetConf:     args.StdinData,
		})
		if err != nil {
			return p.rpcError(verb, sock, err)
		}
		if e := reply.Error; e != nil {
			return newError(uint(e.Code), e.Msg, e.Details)
		}
		if len(reply.Result) > 0 {
			if _, err := os.Stdout.Write(reply.Result); err != nil {
				return newError(errIOFailure, "write result: "+err.Error(), "")
			}
		}
		return nil
	}
}

// codeUnimplemented is gRPC's status for a service the server lacks.
const codeUnimplemented = 12

func (p Plugin) rpcError(verb, sock string, err error) error {
	var se *cniclient.StatusError
	switch {
	case errors.Is(err, cniclient.ErrUnavailable),
		errors.As(err, &se) && se.Code == cniclient.CodeUnavailable:
		return unreachable(verb, sock, err)
	case errors.As(err, &se) && se.Code == codeUnimplemented:
		msg := p.Unimplemented
		if msg == "" {
			msg = "skeind at " + sock + " does not serve " + p.Service
		}
		return newError(errPluginNotAvailable, msg, err.Error())
	case errors.As(err, &se) && se.Code == cniclient.CodeDeadlineExceeded:
		return newError(errTryAgainLater, fmt.Sprintf("skeind did not answer %s within %v", verb, CallTimeout), "")
	}
	return newError(errInternal, fmt.Sprintf("skeind failed %s: %v", verb, err), "")
}

// unreachable: STATUS reports the plugin unavailable (50); other verbs ask
// the runtime to retry (11), so nothing is forgotten while skeind restarts.
func unreachable(verb, sock string, err error) error {
	code := uint(errTryAgainLater)
	if verb == "STATUS" {
		code = errPluginNotAvailable
	}
	return newError(code, fmt.Sprintf("cannot reach skeind at %s: is it running?", sock), err.Error())
}

// notOwnNetNS refuses a CNI_NETNS that is the namespace the plugin itself
// runs in, i.e. the runtime's own (usually the host's): skeind cannot see
// the caller's namespace, so this check is made here. (skeind refuses the
// node's, its own and PID 1's.) Two stats, no parsing: the plugin must
// start fast.
func notOwnNetNS(path string) error {
	var pod, self syscall.Stat_t
	if path == "" || syscall.Stat(path, &pod) != nil || syscall.Stat("/proc/self/ns/net", &self) != nil {
		return nil // skeind reports a missing or unreadable namespace
	}
	if pod.Dev == self.Dev && pod.Ino == self.Ino {
		return newError(errInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_NETNS %q is the network namespace the runtime runs the plugin in, not a pod's: refusing to plumb a pod interface into it", path), "")
	}
	return nil
}
