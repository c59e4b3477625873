package cniplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/skeinnet/skein/internal/cnirun"
)

// Caller makes one verb's call ("ADD", …) to the service the binary
// names: it returns the result to print or an error (an *Error is the
// spec error the binary prints; any other is an internal one).
type Caller func(verb string, args *Args) ([]byte, error)

// Run runs in skeind what a CNI binary was exec'd for (package cnirun
// handed it over whole): it checks the request as skel would, calls the
// verb and returns what the binary prints and exits with.
func Run(req cnirun.Request, call Caller) cnirun.Reply {
	var out bytes.Buffer
	// The binary stat'ed both namespaces: skeind cannot see its caller's.
	own := req.PodNS != (cnirun.NSID{}) && req.PodNS == req.SelfNS
	verb := func(name string) func(*Args) error {
		return func(args *Args) error {
			if own && (name == "ADD" || name == "CHECK") {
				return newError(errInvalidEnvironmentVariables,
					fmt.Sprintf("CNI_NETNS %q is the network namespace the runtime runs the plugin in, not a pod's: refusing to plumb a pod interface into it", args.Netns), "")
			}
			result, err := call(name, args)
			out.Write(result)
			return err
		}
	}
	v := Verbs{Add: verb("ADD"), Del: verb("DEL"), Check: verb("CHECK"), GC: verb("GC"), Status: verb("STATUS")}
	if e := dispatch(req.Getenv, bytes.NewReader(req.Stdin), &out, io.Discard, v, "", own); e != nil {
		printError(&out, versionOf(req.Stdin), e)
		return cnirun.Reply{Exit: 1, Stdout: out.Bytes()}
	}
	return cnirun.Reply{Stdout: out.Bytes()}
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

// printError writes the spec's error object. When the configuration gave
// no version (it could not be decoded) the newest one skein speaks is
// named.
func printError(w io.Writer, confVersion string, e *Error) {
	if confVersion == "" {
		confVersion = "1.1.0"
	}
	out, _ := json.MarshalIndent(struct {
		CNIVersion string `json:"cniVersion"`
		Code       uint   `json:"code"`
		Msg        string `json:"msg"`
		Details    string `json:"details,omitempty"`
	}{confVersion, e.Code, e.Msg, e.Details}, "", "    ")
	w.Write(append(out, '\n'))
}

// gRPC status codes a failed call is judged by.
const (
	codeDeadlineExceeded = 4
	codeUnimplemented    = 12
	codeUnavailable      = 14
)

// CallFailed is the spec error for a verb whose call failed with a gRPC
// status (code and message) rather than answer; timeout is the call's.
func CallFailed(verb string, code int, msg string, timeout time.Duration) *Error {
	switch code {
	case codeUnavailable:
		return newError(errTryAgainLater, "skeind cannot serve "+verb+" now", msg)
	case codeUnimplemented:
		return newError(errPluginNotAvailable, msg, "")
	case codeDeadlineExceeded:
		return newError(errTryAgainLater, fmt.Sprintf("skeind did not answer %s within %v", verb, timeout), "")
	}
	return newError(errInternal, fmt.Sprintf("skeind failed %s: %s", verb, msg), "")
}
