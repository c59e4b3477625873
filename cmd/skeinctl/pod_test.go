package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
)

// fakePods records Pods requests and answers with a canned pod.
type fakePods struct {
	rpc.UnimplementedPodsServer
	mu   sync.Mutex
	reqs []proto.Message
}

func (f *fakePods) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, proto.Clone(m))
}

var cannedPod = &rpc.PodStatus{Id: "u1", Netns: "/run/netns/p", Attachments: []*rpc.PodAttachment{
	{Network: "pods", Ifname: "eth0", Pool: "default", State: "attached", Result: []byte(`{"cniVersion":"1.1.0","ips":[{"address":"10.64.0.1/32"}]}`)},
	{Network: "br", Ifname: "net1", Image: "file:///img.tar", Digest: "sha256:ab", State: "attached", Result: []byte(`{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/24"}]}`)},
}, Skipped: []*rpc.PodSkipped{{Network: "opt", Error: "exit status 2"}}}

func (f *fakePods) Attach(_ context.Context, r *rpc.PodAttachRequest) (*rpc.PodStatus, error) {
	f.record(r)
	return cannedPod, nil
}

func (f *fakePods) Detach(_ context.Context, r *rpc.PodRef) (*rpc.Empty, error) {
	f.record(r)
	return &rpc.Empty{}, nil
}

func (f *fakePods) Status(_ context.Context, r *rpc.PodRef) (*rpc.PodStatus, error) {
	f.record(r)
	if r.Id != "u1" {
		return nil, status.Error(codes.NotFound, "pod "+r.Id+": no pod networks recorded for this pod")
	}
	return cannedPod, nil
}

func servePods(t *testing.T, f *fakePods) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "skeind.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rpc.RegisterPodsServer(s, f)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return sock
}

func TestPodCommands(t *testing.T) {
	f := &fakePods{}
	sock := servePods(t, f)
	out, errOut, code := cli(nil, "--socket", sock, "pod", "attach", "--id", "u1", "--netns", "/run/netns/p",
		"--network", "pods", "--network", "br@net1")
	if code != 0 {
		t.Fatalf("attach: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"pods", "eth0", "10.64.0.1/32", "pool default", "file:///img.tar", "10.1.0.5/24", "skipped: exit status 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("attach table lacks %q:\n%s", want, out)
		}
	}
	if _, errOut, code = cli(nil, "--socket", sock, "pod", "detach", "--id", "u1"); code != 0 {
		t.Fatalf("detach: exit %d: %s", code, errOut)
	}
	out, _, code = cli(nil, "--socket", sock, "pod", "status", "--id", "u1", "-o", "json")
	if code != 0 || !strings.Contains(out, `"network": "br"`) {
		t.Errorf("status -o json: exit %d\n%s", code, out)
	}
	want := []proto.Message{
		&rpc.PodAttachRequest{Id: "u1", Netns: "/run/netns/p", Networks: []*rpc.PodNetwork{{Network: "pods"}, {Network: "br", Ifname: "net1"}}},
		&rpc.PodRef{Id: "u1"}, &rpc.PodRef{Id: "u1"},
	}
	if len(f.reqs) != len(want) {
		t.Fatalf("requests %v", f.reqs)
	}
	for i := range want {
		if !proto.Equal(f.reqs[i], want[i]) {
			t.Errorf("request %d: %v, want %v", i, f.reqs[i], want[i])
		}
	}

	for _, c := range []struct {
		args    []string
		wantErr string
		code    int
	}{
		{[]string{"pod", "status", "--id", "nope"}, "skeinctl: pod nope: no pod networks recorded for this pod", 1},
		{[]string{"pod", "attach", "--netns", "/run/netns/p"}, "skeinctl: pod attach needs --id and --netns", 2},
		{[]string{"pod", "attach", "--id", "u1", "--netns", "/x", "--network", "br@"}, `skeinctl: invalid --network "br@": want NAME or NAME@IFNAME`, 2},
		{[]string{"pod", "detach"}, "skeinctl: pod detach needs --id", 2},
	} {
		_, errOut, code := cli(nil, append([]string{"--socket", sock}, c.args...)...)
		if first, _, _ := strings.Cut(errOut, "\n"); code != c.code || first != c.wantErr {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", c.args, code, errOut, c.code, c.wantErr)
		}
	}
}
