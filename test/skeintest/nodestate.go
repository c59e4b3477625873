package skeintest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
)

// Export table and protocol of skeind's defaults (tests do not change them).
const (
	ExportTable = 119
	ExportProto = 30
)

// NodeState snapshots the node namespace for "nothing left behind"
// checks, export table included. A block stays claimed by its node after
// its last address is released, so its blackhole route rightly outlives
// the attachments that claimed it; NodeState therefore checks the export
// table against the blocks skeind reports this node owns right now and
// leaves out only the routes those blocks account for. Any other route in
// the table (a deleted pool's block, a route of the wrong type) stays in
// the State, so comparing it with an earlier one reports it; an owned
// block without its route is an error here.
//
// The export follows block changes asynchronously, so NodeState waits (up
// to five seconds) for the table to match before it reports.
func (d *Daemon) NodeState(t testing.TB) harness.State {
	t.Helper()
	admin := d.Admin(t)
	var st harness.State
	var problems []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = harness.Snapshot(t, d.Node)
		problems = explainExports(t, admin, &st)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range problems {
		t.Errorf("export table %d: %s", ExportTable, p)
	}
	return st
}

// explainExports removes from st the export routes of blocks this node
// owns and returns what does not match: owned blocks without their route
// and routes no owned block explains (those stay in st).
func explainExports(t testing.TB, admin rpc.AdminClient, st *harness.State) []string {
	t.Helper()
	owned := ownedBlocks(t, admin)
	prefix := fmt.Sprintf("table %d ", ExportTable)
	var problems []string
	seen := map[netip.Prefix]bool{}
	st.Routes = slices.DeleteFunc(st.Routes, func(r string) bool {
		if !strings.HasPrefix(r, prefix) {
			return false
		}
		// "table T type Y DST via GW dev DEV proto P scope S"
		f := strings.Fields(r)
		dst, err := netip.ParsePrefix(f[4])
		explained := err == nil && owned[dst] && !seen[dst] &&
			f[3] == "6" && slices.Contains(f, "proto") && f[slices.Index(f, "proto")+1] == fmt.Sprint(ExportProto)
		if !explained {
			problems = append(problems, "route no block of this node explains: "+r)
			return false
		}
		seen[dst] = true
		return true
	})
	for b := range owned {
		if !seen[b] {
			problems = append(problems, fmt.Sprintf("block %s is this node's but has no blackhole route", b))
		}
	}
	slices.Sort(problems)
	return problems
}

// ownedBlocks asks skeind which block prefixes its node owns.
func ownedBlocks(t testing.TB, admin rpc.AdminClient) map[netip.Prefix]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, err := admin.Status(ctx, &rpc.Empty{})
	if err != nil {
		t.Fatalf("skeind status: %v", err)
	}
	l, err := admin.ListBlocks(ctx, &rpc.BlockFilter{})
	if err != nil {
		t.Fatalf("list blocks: %v", err)
	}
	owned := map[netip.Prefix]bool{}
	for _, b := range l.Blocks {
		if b.Node != status.Node {
			continue
		}
		for _, s := range []string{b.Ipv4, b.Ipv6} {
			if s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				t.Fatalf("block %d of pool %s: prefix %q: %v", b.Index, b.Pool, s, err)
			}
			owned[p] = true
		}
	}
	return owned
}
