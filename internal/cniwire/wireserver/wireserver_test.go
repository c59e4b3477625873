package wireserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cnirun"
)

// fakeCNI answers every method with reply and err, recording the verbs.
type fakeCNI struct {
	reply *rpc.CNIReply
	err   error
	panic any // when set, every method panics with it
	got   []string
}

func (f *fakeCNI) call(name string, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	f.got = append(f.got, name+" "+r.ContainerId+" "+r.Ifname)
	if f.panic != nil {
		panic(f.panic)
	}
	return f.reply, f.err
}
func (f *fakeCNI) Add(_ context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	return f.call("Add", r)
}
func (f *fakeCNI) Del(_ context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	return f.call("Del", r)
}
func (f *fakeCNI) Check(_ context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	return f.call("Check", r)
}
func (f *fakeCNI) Status(_ context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	return f.call("Status", r)
}
func (f *fakeCNI) GC(_ context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	return f.call("GC", r)
}

func exec(service, cmd string) cnirun.Request {
	return cnirun.Request{Service: service, TimeoutMS: 60000, Stdin: []byte(`{"cniVersion":"1.1.0","name":"n"}`),
		Env: []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=c1", "CNI_NETNS=/run/netns/p", "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin"}}
}

func specCode(t *testing.T, rep cnirun.Reply) (uint, string) {
	t.Helper()
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if rep.Exit != 1 || json.Unmarshal(rep.Stdout, &e) != nil {
		t.Fatalf("exit %d %q: want a spec error", rep.Exit, rep.Stdout)
	}
	return e.Code, e.Msg
}

// TestRunHandler: each verb reaches its method with the runtime's
// arguments; a result is printed, a CNI error and a failed call become
// the spec errors a runtime expects; a service skeind lacks says why.
func TestRunHandler(t *testing.T) {
	f := &fakeCNI{reply: &rpc.CNIReply{Result: []byte(`{"ok":1}`)}}
	h := RunHandler(map[string]rpc.CNIMethods{"skein.v1.CNI": f})
	ctx := context.Background()
	for _, cmd := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS"} {
		if rep := h(ctx, exec("skein.v1.CNI", cmd)); rep.Exit != 0 {
			t.Errorf("%s: exit %d %s", cmd, rep.Exit, rep.Stdout)
		}
	}
	if want := "Add c1 eth0,Del c1 eth0,Check c1 eth0,GC c1 eth0,Status c1 eth0"; strings.Join(f.got, ",") != want {
		t.Errorf("calls %v, want %s", f.got, want)
	}
	if rep := h(ctx, exec("skein.v1.CNI", "ADD")); string(rep.Stdout) != `{"ok":1}` {
		t.Errorf("ADD printed %q", rep.Stdout)
	}

	f.reply = &rpc.CNIReply{Error: &rpc.CNIError{Code: 7, Msg: "no such pool"}}
	if code, msg := specCode(t, h(ctx, exec("skein.v1.CNI", "ADD"))); code != 7 || msg != "no such pool" {
		t.Errorf("a CNI error: %d %q", code, msg)
	}
	f.reply, f.err = nil, status.Error(codes.Unavailable, "shutting down")
	if code, _ := specCode(t, h(ctx, exec("skein.v1.CNI", "ADD"))); code != 11 {
		t.Errorf("Unavailable: code %d, want 11 (try again later)", code)
	}
	f.err = status.Error(codes.Internal, "boom")
	if code, msg := specCode(t, h(ctx, exec("skein.v1.CNI", "DEL"))); code != 999 || !strings.Contains(msg, "boom") {
		t.Errorf("Internal: %d %q, want 999 naming the failure", code, msg)
	}
	if code, msg := specCode(t, h(ctx, exec("skein.v1.VM", "ADD"))); code != 50 || !strings.Contains(msg, "--vm-socket=off") {
		t.Errorf("no VM service: %d %q, want 50 with the hint", code, msg)
	}
	if code, msg := specCode(t, h(ctx, exec("skein.v1.Other", "ADD"))); code != 50 || !strings.Contains(msg, "skein.v1.Other") {
		t.Errorf("unknown service: %d %q", code, msg)
	}
}

// TestRunHandlerPanic: a method that panics (a bug input can trigger)
// fails its own call with a spec error, and skeind goes on serving.
func TestRunHandlerPanic(t *testing.T) {
	f := &fakeCNI{panic: "index out of range [0] with length 0"}
	h := RunHandler(map[string]rpc.CNIMethods{"skein.v1.CNI": f})
	if code, msg := specCode(t, h(context.Background(), exec("skein.v1.CNI", "ADD"))); code != 999 || !strings.Contains(msg, "index out of range") {
		t.Errorf("a panicking ADD: %d %q, want 999 naming the panic", code, msg)
	}
	f.panic, f.reply = nil, &rpc.CNIReply{Result: []byte(`{}`)}
	if rep := h(context.Background(), exec("skein.v1.CNI", "DEL")); rep.Exit != 0 {
		t.Errorf("the next call: exit %d %s", rep.Exit, rep.Stdout)
	}
}
