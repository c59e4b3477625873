package vm

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/store"
)

// Host is what the VM front door needs from the daemon that hosts it
// (*daemon.Daemon in skeind): the store, a logger, the gRPC server to
// register on, a hook to stop with it, and the request metrics. Keeping
// it this narrow lets the front door be built and tested without skeind.
type Host interface {
	// Store holds the VM records and the token secret.
	Store() store.Store
	// Logger is the daemon's logger.
	Logger() *slog.Logger
	// GRPC is where the VM service registers, before skeind serves.
	GRPC() grpc.ServiceRegistrar
	// RegisterCNIMethods serves the same service on the CNI binaries'
	// short path (internal/cniwire).
	RegisterCNIMethods(service string, m rpc.CNIMethods)
	// OnStop registers f to run when the daemon closes, before the
	// store is closed.
	OnStop(f func())
	// Observe records one request of a front door; code 0 is success.
	Observe(frontdoor, verb string, code uint, took time.Duration)
}
