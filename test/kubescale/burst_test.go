package kubescale

import (
	"net/netip"
	"strings"
	"testing"
)

// maxWritesPerClaim bounds the creates per block in TestClaimBurst. Nodes
// probe from a seed of their name, so with a pool twice the size of what
// is claimed a few collide (about 1 in 10 claims at this size); nodes
// probing from one place would collide on nearly every claim of a round
// (WritesPerClaim of several).
const maxWritesPerClaim = 1.5

// TestClaimBurst is the benchmark's run at a small size, with its
// figures asserted: 30 nodes as skeind's identity start at once and bring
// 3,000 addresses into use (four blocks each, four rounds), with leases,
// the controller's webhook, skeind's priority level, every node's watches
// and every node's handlers on every block event, as in a cluster.
func TestClaimBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	p := params{nodes: 30, pods: 3000, bits: 5, controllerQPS: 100, flowSchema: true, webhook: true, leases: true, watch: true, fanout: true, steady: 8}
	r := run(t, p)
	t.Logf("claims %d (p50 %.0f ms, p99 %.0f ms), blocks %d, collisions %d, writes per claim %.3f, 429s %d/%d, ADD with a spare p99 %.1f µs (bolt %.1f µs)",
		r.Claims, r.ClaimP50ms, r.ClaimP99ms, r.Blocks, r.Collisions, r.WritesPerClaim, r.Rejected429, r.Responses429,
		r.AddSpareP99ms*1000, r.AddBoltP99ms*1000)

	// Everything the run checked itself: no address on two pods, every
	// address in its node's block in the API, every node's blocks exactly
	// the API's, every claim and ADD succeeded, no block lost.
	for _, pr := range r.problems {
		t.Error(pr)
	}
	if r.Duplicates != 0 {
		t.Errorf("%d addresses on two pods", r.Duplicates)
	}
	if r.GrantErrors != 0 {
		t.Errorf("%d grants failed", r.GrantErrors)
	}
	// 100 pods a node in blocks of 32: four blocks each (one at start,
	// three in the burst).
	if want := int64(4 * p.nodes); r.Blocks != want {
		t.Errorf("nodes obtained %d blocks, want %d", r.Blocks, want)
	}
	if r.WritesPerClaim < 1 || r.WritesPerClaim > maxWritesPerClaim {
		t.Errorf("%.3f AddressBlock creates per block obtained, want 1 to %g", r.WritesPerClaim, maxWritesPerClaim)
	}
	// kubestore counts the same refusals as the nodes' transports.
	if r.LeaseErrors != 0 {
		t.Errorf("%d Lease renewals failed", r.LeaseErrors)
	}
	if int64(r.storeConflicts) != r.Collisions {
		t.Errorf("skein_block_claim_conflicts_total sums to %.0f, the nodes saw %d 409s to their creates", r.storeConflicts, r.Collisions)
	}
	if r.Rejected429 != 0 || r.Responses429 != 0 {
		t.Errorf("API server rejected %d requests (the nodes saw %d 429s) with skeind's priority level", r.Rejected429, r.Responses429)
	}
	if r.RequestsOutsideLevel != 0 {
		t.Errorf("%d of the nodes' requests were served outside skeind's priority level: the FlowSchema does not match skeind", r.RequestsOutsideLevel)
	}
	if r.AddSpareAPIRequests != 0 {
		t.Errorf("ADDs with a spare block made %d API requests, want none", r.AddSpareAPIRequests)
	}
	if r.WritesPerAddBeyondClaims != 0 {
		t.Errorf("ADDs that claimed nothing wrote %g times each to the API", r.WritesPerAddBeyondClaims)
	}
}

// TestCheckAddresses: the end-of-run check finds each kind of problem it
// is there for, so a clean run means something.
func TestCheckAddresses(t *testing.T) {
	pfx := netip.MustParsePrefix
	ad := netip.MustParseAddr
	blocks := []apiBlock{
		{Name: "default-0", Node: "a", Prefixes: []netip.Prefix{pfx("10.0.0.0/27")}},
		{Name: "default-1", Node: "b", Prefixes: []netip.Prefix{pfx("10.0.0.32/27")}},
	}
	for _, c := range []struct {
		name   string
		blocks []apiBlock
		held   map[string][]netip.Addr
		want   string // in a problem; "" = none
		dups   int
	}{
		{"clean", blocks, map[string][]netip.Addr{"a": {ad("10.0.0.1"), ad("10.0.0.2")}, "b": {ad("10.0.0.33")}}, "", 0},
		{"one address on two nodes", blocks, map[string][]netip.Addr{"a": {ad("10.0.0.1")}, "b": {ad("10.0.0.1")}}, "handed out twice", 1},
		{"twice on one node", blocks, map[string][]netip.Addr{"a": {ad("10.0.0.1"), ad("10.0.0.1")}}, "handed out twice", 1},
		{"address in another node's block", blocks, map[string][]netip.Addr{"a": {ad("10.0.0.40")}}, `its block is "b"'s`, 0},
		{"address in no block", blocks, map[string][]netip.Addr{"a": {ad("10.0.1.1")}}, `its block is ""'s`, 0},
		{"overlapping blocks", append(blocks[:2:2], apiBlock{Name: "other-0", Node: "c", Prefixes: []netip.Prefix{pfx("10.0.0.0/26")}}),
			map[string][]netip.Addr{}, "overlap", 0},
		{"block without owner", append(blocks[:2:2], apiBlock{Name: "default-2", Prefixes: []netip.Prefix{pfx("10.0.0.64/27")}}),
			map[string][]netip.Addr{}, "no nodeName", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			problems, dups := checkAddresses(c.blocks, c.held)
			if dups != c.dups {
				t.Errorf("dups %d, want %d", dups, c.dups)
			}
			got := strings.Join(problems, "\n")
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("problems:\n%s\nwant one with %q", got, c.want)
			}
		})
	}
}

// TestCheckOwned: a node holding a block the API does not give it, or not
// holding one it does, is reported.
func TestCheckOwned(t *testing.T) {
	pfx := netip.MustParsePrefix
	blocks := []apiBlock{
		{Name: "default-0", Node: "a", Prefixes: []netip.Prefix{pfx("10.0.0.0/27")}},
		{Name: "default-1", Node: "a", Prefixes: []netip.Prefix{pfx("10.0.0.32/27")}},
	}
	if p := checkOwned(blocks, map[string][]netip.Prefix{"a": {pfx("10.0.0.32/27"), pfx("10.0.0.0/27")}}); len(p) != 0 {
		t.Errorf("same blocks in another order: %v", p)
	}
	if p := checkOwned(blocks, map[string][]netip.Prefix{"a": {pfx("10.0.0.0/27")}}); len(p) != 1 {
		t.Errorf("a block leaked in the API: %v, want one problem", p)
	}
	if p := checkOwned(blocks, map[string][]netip.Prefix{"b": {pfx("10.0.0.0/27")}}); len(p) != 1 {
		t.Errorf("a node using another's block: %v, want one problem", p)
	}
}

// TestResourceVersion: the simulated watches resume from the object's
// resourceVersion of the last event.
func TestResourceVersion(t *testing.T) {
	for line, want := range map[string]string{
		`{"type":"ADDED","object":{"apiVersion":"skein.dev/v1alpha1","kind":"AddressBlock","metadata":{"name":"default-3","resourceVersion":"1234","labels":{}}}}`: "1234",
		`{"type":"BOOKMARK","object":{"kind":"AddressBlock","apiVersion":"skein.dev/v1alpha1","metadata":{"resourceVersion":"99"}}}`:                               "99",
		`{"type":"ERROR","object":{"kind":"Status","code":410}}`:                                                                                                   "",
	} {
		if got, _ := resourceVersion([]byte(line)); got != want {
			t.Errorf("resourceVersion(%s) = %q, want %q", line, got, want)
		}
	}
}
