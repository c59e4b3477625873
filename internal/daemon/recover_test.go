package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRecoverUnary: a gRPC handler that panics (a bug input can trigger)
// fails its call as Internal; skeind is not taken down with it.
func TestRecoverUnary(t *testing.T) {
	i := recoverUnary(slog.Default())
	info := &grpc.UnaryServerInfo{FullMethod: "/skein.v1.CNI/Add"}
	_, err := i(context.Background(), nil, info, func(context.Context, any) (any, error) {
		var none []int
		return none[0], nil
	})
	if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "index out of range") {
		t.Errorf("a panicking handler: %v, want Internal naming the panic", err)
	}
	got, err := i(context.Background(), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	if got != "ok" || err != nil {
		t.Errorf("a handler that returns: %v, %v", got, err)
	}
}
