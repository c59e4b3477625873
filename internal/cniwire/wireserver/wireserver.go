// Package wireserver is skeind's side of the short path (package cniwire)
// for its gRPC services: it runs a call's method as the gRPC server would
// have, with the same protobuf messages and the same status codes and
// messages. It is apart from package cniwire so that the CNI binary, which
// links cniwire, links no protobuf or gRPC.
package wireserver

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cniwire"
)

// Handler serves the methods of services (by gRPC service name, e.g.
// "skein.v1.CNI"). The map is read on every call: fill it before serving.
func Handler(services map[string]rpc.CNIMethods) cniwire.Handler {
	return func(ctx context.Context, method string, body []byte) cniwire.Reply {
		service, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		var f func(context.Context, *rpc.CNIRequest) (*rpc.CNIReply, error)
		if m := services[service]; m != nil {
			switch name {
			case "Add":
				f = m.Add
			case "Del":
				f = m.Del
			case "Check":
				f = m.Check
			case "Status":
				f = m.Status
			case "GC":
				f = m.GC
			}
		}
		if f == nil {
			return cniwire.Reply{Code: uint32(codes.Unimplemented), Message: "unknown method " + method}
		}
		var req rpc.CNIRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			return cniwire.Reply{Code: uint32(codes.Internal), Message: "error unmarshalling request: " + err.Error()}
		}
		rep, err := f(ctx, &req)
		if err != nil {
			st := status.Convert(err)
			if st.Code() == codes.Unknown && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				// The call's own deadline or cancellation, as a gRPC
				// client would see it.
				st = status.FromContextError(ctx.Err())
			}
			return cniwire.Reply{Code: uint32(st.Code()), Message: st.Message()}
		}
		out, err := proto.Marshal(rep)
		if err != nil {
			return cniwire.Reply{Code: uint32(codes.Internal), Message: "error marshalling reply: " + err.Error()}
		}
		return cniwire.Reply{Body: out}
	}
}
