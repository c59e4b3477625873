package daemon

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// nsStore answers PoolForNamespace from a map, as the Kubernetes store
// does from its namespace cache ("" = a namespace without the
// annotation); a namespace not in the map cannot be read.
type nsStore struct {
	store.Store
	pools map[string]string
}

func (s nsStore) PoolForNamespace(_ context.Context, ns string) (string, bool, error) {
	p, ok := s.pools[ns]
	if !ok {
		return "", false, fmt.Errorf("namespace %q does not exist: %w", ns, store.ErrNotFound)
	}
	return p, p != "", nil
}

func TestChoosePool(t *testing.T) {
	ns := nsStore{pools: map[string]string{"team-blue": "blue", "plain": ""}}
	for _, tc := range []struct {
		name  string
		st    store.Store
		args  string
		want  string
		fails bool
	}{
		{"annotated namespace", ns, "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-blue;K8S_POD_NAME=p", "blue", false},
		{"namespace without annotation", ns, "K8S_POD_NAMESPACE=plain", "net-pool", false},
		{"no namespace in CNI_ARGS", ns, "", "net-pool", false},
		{"embedded store ignores namespaces", nsStore{}.Store, "K8S_POD_NAMESPACE=team-blue", "net-pool", false},
		{"unreadable CNI_ARGS", ns, "K8S_POD_NAMESPACE", "net-pool", true},
		// Never the default pool for a namespace the store cannot read: a
		// tenant's pod would get another tenant's addresses.
		{"unknown namespace", ns, "K8S_POD_NAMESPACE=team-red", "net-pool", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Daemon{st: tc.st}
			conf := &cni.NetConf{Pool: "net-pool"}
			err := d.choosePool(context.Background(), conf, tc.args)
			if (err != nil) != tc.fails {
				t.Fatalf("choosePool(%q) = %v, want failure %v", tc.args, err, tc.fails)
			}
			if conf.Pool != tc.want {
				t.Errorf("pool %q, want %q", conf.Pool, tc.want)
			}
		})
	}
}

// No block in time is "try again later" (spec code 11), not an internal
// error: the runtime retries.
func TestAttachErrorTryAgain(t *testing.T) {
	err := fmt.Errorf("allocate: get a block of pool %q: %w", "p", ipam.ErrTryAgain)
	var e *types.Error
	if !errors.As(attachError(err, &cni.NetConf{Pool: "p"}), &e) || e.Code != types.ErrTryAgainLater {
		t.Fatalf("attachError = %v, want code %d", e, types.ErrTryAgainLater)
	}
}
