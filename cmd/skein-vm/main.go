// Command skein-vm is skein's chained CNI plugin for VMs. Put it after any
// main plugin (skein, bridge, …) in a conflist: it forwards each call, with
// the main plugin's result in prevResult, to skeind's VM service in one
// timed gRPC call and prints skeind's answer or a spec error. skeind does
// the work inside the pod's namespace: bridge, tap and a DHCP server that
// serves the VM exactly the main plugin's result (see internal/vm). Like
// the skein binary it makes its call with internal/cniclient, not grpc-go,
// so it starts fast; imports_test.go keeps it so.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/skeinnet/skein/internal/cniclient"
)

// DefaultSocket is where skeind listens unless the network config's
// "socket" or $SKEIN_SOCKET says otherwise.
const DefaultSocket = "/run/skein/skeind.sock"

// service is skeind's gRPC service for VMs (api/rpc/vm.proto).
const service = "skein.v1.VM"

const callTimeout = 60 * time.Second

var buildVersion = "dev"

func main() {
	confVersion := peekVersion()
	if e := skel.PluginMainFuncsWithError(skel.CNIFuncs{
		Add:    call("ADD"),
		Del:    call("DEL"),
		Check:  call("CHECK"),
		GC:     call("GC"),
		Status: call("STATUS"),
	}, version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "skein-vm CNI plugin "+buildVersion); e != nil {
		printError(confVersion, e)
		os.Exit(1)
	}
}

// peekVersion reads the configuration ahead of skel so an error can carry
// its cniVersion (skel's own printer leaves it out); skel then reads the
// same bytes from a pipe.
func peekVersion() string {
	if os.Getenv("CNI_COMMAND") == "" {
		return ""
	}
	data, err := io.ReadAll(os.Stdin)
	r, w, perr := os.Pipe()
	if perr != nil {
		return ""
	}
	go func() {
		_, _ = w.Write(data)
		w.Close()
	}()
	os.Stdin = r
	if err != nil {
		return ""
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(data, &c)
	return c.CNIVersion
}

// printError writes the spec's error object to stdout.
func printError(confVersion string, e *types.Error) {
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

func socketPath(stdin []byte) string {
	var c struct {
		Socket string `json:"socket"`
	}
	_ = json.Unmarshal(stdin, &c)
	if c.Socket != "" {
		return c.Socket
	}
	if s := os.Getenv("SKEIN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

var methods = map[string]string{"ADD": "Add", "DEL": "Del", "CHECK": "Check", "GC": "GC", "STATUS": "Status"}

func call(verb string) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		sock := socketPath(args.StdinData)
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		reply, err := cniclient.CallService(ctx, sock, service, methods[verb], cniclient.Request{
			ContainerID: args.ContainerID,
			NetNS:       args.Netns,
			IfName:      args.IfName,
			Args:        args.Args,
			Path:        args.Path,
			NetConf:     args.StdinData,
		})
		if err != nil {
			return rpcError(verb, sock, err)
		}
		if e := reply.Error; e != nil {
			return types.NewError(uint(e.Code), e.Msg, e.Details)
		}
		if len(reply.Result) > 0 {
			if _, err := os.Stdout.Write(reply.Result); err != nil {
				return types.NewError(types.ErrIOFailure, "write result: "+err.Error(), "")
			}
		}
		return nil
	}
}

// codeUnimplemented is gRPC's status for a service the server lacks.
const codeUnimplemented = 12

func rpcError(verb, sock string, err error) error {
	var se *cniclient.StatusError
	switch {
	case errors.Is(err, cniclient.ErrUnavailable):
		return unreachable(verb, sock, err)
	case errors.As(err, &se) && se.Code == cniclient.CodeUnavailable:
		return unreachable(verb, sock, err)
	case errors.As(err, &se) && se.Code == codeUnimplemented:
		return types.NewError(types.ErrPluginNotAvailable, "skeind at "+sock+" does not serve VMs (started with --vm-socket=off?)", err.Error())
	case errors.As(err, &se) && se.Code == cniclient.CodeDeadlineExceeded:
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("skeind did not answer %s within %v", verb, callTimeout), "")
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("skeind failed %s: %v", verb, err), "")
}

// unreachable: STATUS reports the plugin unavailable (50); other verbs ask
// the runtime to retry (11).
func unreachable(verb, sock string, err error) error {
	code := uint(types.ErrTryAgainLater)
	if verb == "STATUS" {
		code = types.ErrPluginNotAvailable
	}
	return types.NewError(code, fmt.Sprintf("cannot reach skeind at %s: is it running?", sock), err.Error())
}
