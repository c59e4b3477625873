// Package wireserver runs the CNI binaries' execs (package cnirun) against
// skeind's gRPC services (skein.v1.CNI, skein.v1.VM), calling their
// methods in-process with the protobuf request a gRPC client would have
// sent, and judging their errors by the status codes a client would have
// seen.
package wireserver

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cniplugin"
	"github.com/skeinnet/skein/internal/cnirun"
	"github.com/skeinnet/skein/internal/cniwire"
)

// methodOf is m's method for a CNI verb (the verbs dispatch calls).
func methodOf(m rpc.CNIMethods, verb string) func(context.Context, *rpc.CNIRequest) (*rpc.CNIReply, error) {
	switch verb {
	case "ADD":
		return m.Add
	case "DEL":
		return m.Del
	case "CHECK":
		return m.Check
	case "STATUS":
		return m.Status
	}
	return m.GC
}

// callStatus is a method's error as a gRPC client would see it: the call's
// own deadline or cancellation as such.
func callStatus(ctx context.Context, err error) *status.Status {
	st := status.Convert(err)
	if st.Code() == codes.Unknown && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		st = status.FromContextError(ctx.Err())
	}
	return st
}

// hints say why skeind may lack a service.
var hints = map[string]string{"skein.v1.VM": "skeind does not serve VMs (started with --vm-socket=off?)"}

// RunHandler runs the CNI binaries' execs (package cnirun) against
// services, calling the methods in-process.
func RunHandler(services map[string]rpc.CNIMethods) cniwire.RunHandler {
	return func(ctx context.Context, req cnirun.Request) cnirun.Reply {
		timeout := time.Duration(req.TimeoutMS) * time.Millisecond
		return cniplugin.Run(req, func(verb string, a *cniplugin.Args) ([]byte, error) {
			m := services[req.Service]
			if m == nil {
				msg := hints[req.Service]
				if msg == "" {
					msg = "skeind does not serve " + req.Service
				}
				return nil, cniplugin.CallFailed(verb, int(codes.Unimplemented), msg, timeout)
			}
			rep, err := call(methodOf(m, verb), ctx, &rpc.CNIRequest{
				ContainerId: a.ContainerID, Netns: a.Netns, Ifname: a.IfName, Args: a.Args, Path: a.Path, Netconf: a.StdinData,
			})
			if err != nil {
				st := callStatus(ctx, err)
				return nil, cniplugin.CallFailed(verb, int(st.Code()), st.Message(), timeout)
			}
			if e := rep.GetError(); e != nil {
				return nil, &cniplugin.Error{Code: uint(e.Code), Msg: e.Msg, Details: e.Details}
			}
			return rep.Result, nil
		})
	}
}

// call runs a method; a panic in it (a bug) fails this call alone, with
// an Internal error, instead of taking skeind and every other call down
// with it: a runtime retries an ADD it saw fail, and a panic that input
// can trigger would otherwise crash skeind again on every retry.
func call(f func(context.Context, *rpc.CNIRequest) (*rpc.CNIReply, error), ctx context.Context, r *rpc.CNIRequest) (rep *rpc.CNIReply, err error) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("a CNI call panicked (a bug: please report it)", "container", r.ContainerId, "panic", p, "stack", string(debug.Stack()))
			rep, err = nil, status.Errorf(codes.Internal, "skeind failed this call on a bug (its log has the details): %v", p)
		}
	}()
	return f(ctx, r)
}
