package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/skeinnet/skein/api/rpc"
)

// TestStatusMatchesAdd: STATUS says "available" exactly when the next ADD
// would get its addresses. It used to count a block that is all reserved
// as room, and the two families of a dual-stack pool together, so it said
// yes while the ADD right after it failed.
func TestStatusMatchesAdd(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{Pools: []PoolSpec{
		// One block of 4: .0 and .3 cannot be handed out, .1-.2 reserved.
		{Name: "r", Subnets: []string{"10.1.0.0/30"}, BlockSizeBits: 2, Reserved: []string{"10.1.0.1-10.1.0.2"}},
		// Dual stack, one block of 4 each: IPv4 has 2 usable, IPv6 4.
		{Name: "d", Subnets: []string{"10.2.0.0/30", "fd00:2::/126"}, BlockSizeBits: 2},
	}})
	s := &cniServer{d: n.d}
	status := func(pool string) *rpc.CNIError {
		r, err := s.Status(ctx, &rpc.CNIRequest{Netconf: []byte(`{"cniVersion":"1.1.0","name":"net","type":"skein","pool":"` + pool + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return r.Error
	}
	for i, pool := range []string{"r", "d", "d", "d", "d"} {
		st := status(pool)
		r := attachReq(fmt.Sprintf("c%d", i))
		r.Pool = pool
		_, _, err := n.d.Attach(ctx, r)
		switch {
		case err != nil && st == nil:
			t.Errorf("pool %s: STATUS said available, the ADD right after it failed: %v", pool, err)
		case err == nil && st != nil:
			t.Errorf("pool %s: STATUS said %q, the ADD right after it worked", pool, st.Msg)
		case st != nil && (st.Code != 50 || !strings.Contains(st.Msg, "exhausted")):
			t.Errorf("pool %s: STATUS %d %q, want 50 saying exhausted", pool, st.Code, st.Msg)
		}
		t.Logf("pool %s: STATUS %v, then ADD: %v", pool, st, err)
	}
}
