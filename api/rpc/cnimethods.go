package rpc

import "context"

// CNIMethods are the methods skeind's CNI and VM services share: each takes
// a CNIRequest and answers a CNIReply. Both are served over gRPC and over
// the CNI binaries' short path (internal/cniwire), which dispatches on
// this interface.
type CNIMethods interface {
	Add(context.Context, *CNIRequest) (*CNIReply, error)
	Del(context.Context, *CNIRequest) (*CNIReply, error)
	Check(context.Context, *CNIRequest) (*CNIReply, error)
	Status(context.Context, *CNIRequest) (*CNIReply, error)
	GC(context.Context, *CNIRequest) (*CNIReply, error)
}

var (
	_ CNIMethods = CNIServer(nil)
	_ CNIMethods = VMServer(nil)
)
