package daemon

import (
	"context"
	"testing"

	"github.com/skeinnet/skein/internal/cnirun"
	"github.com/skeinnet/skein/internal/cniwire/wireserver"
	"github.com/skeinnet/skein/internal/netns"
)

// BenchmarkRunPair runs CNI ADD+DEL pairs through skeind's handler of the
// binaries' execs (what a `skein` exec asks for, minus the socket), over a
// fake kernel: skeind's own Go work per pair, its allocations above all.
func BenchmarkRunPair(b *testing.B) {
	pod := pinnedNS(b, "pod", "a pinned network namespace for CNI_NETNS")
	n := newTestNode(b, Config{})
	run := wireserver.RunHandler(n.d.wire)
	id, err := netns.IDOf(pod)
	if err != nil {
		b.Fatal(err)
	}
	req := func(verb string) cnirun.Request {
		return cnirun.Request{
			TimeoutMS: 30000, Service: "skein.v1.CNI",
			SelfNS: cnirun.NSID{Dev: 1, Ino: 1}, PodNS: cnirun.NSID{Dev: id.Dev, Ino: id.Ino},
			Env: []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=c0ffee", "CNI_NETNS=" + pod,
				"CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin"},
			Stdin: []byte(`{"cniVersion":"1.1.0","name":"net","type":"skein","pool":"p"}`),
		}
	}
	add, del := req("ADD"), req("DEL")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if r := run(ctx, add); r.Exit != 0 {
			b.Fatalf("ADD: %d %s", r.Exit, r.Stdout)
		}
		if r := run(ctx, del); r.Exit != 0 {
			b.Fatalf("DEL: %d %s", r.Exit, r.Stdout)
		}
	}
}
