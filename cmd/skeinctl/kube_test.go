package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// TestKube reads pools and blocks from a real kube-apiserver, as a cluster
// running skeind --store kubernetes holds them.
func TestKube(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, p := range []*skeinv1.AddressPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: skeinv1.AddressPoolSpec{
			Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.88.0.0/16")}}, BlockSizeBits: 5}},
		{ObjectMeta: metav1.ObjectMeta{Name: "dual"}, Spec: skeinv1.AddressPoolSpec{
			Subnets:       []skeinv1.SubnetSet{{IPv4: ptr.To("10.99.0.0/24"), IPv6: ptr.To("fd99::/120")}},
			BlockSizeBits: 6, Reserved: []string{"10.99.0.1"}}},
	} {
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	dual := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "dual"}, dual); err != nil {
		t.Fatal(err)
	}
	dual.Status.AddressesUsed = ptr.To[int64](3)
	if err := c.Status().Update(ctx, dual); err != nil {
		t.Fatal(err)
	}
	// Made out of order: skeinctl sorts by pool, then index (not name:
	// default-10 sorts before default-2 by name).
	for _, b := range []struct {
		pool, node string
		index      int64
		v4, v6     string
	}{
		{"default", "node-b", 10, "10.88.1.64/27", ""},
		{"dual", "node-a", 0, "10.99.0.0/26", "fd99::/122"},
		{"default", "node-a", 2, "10.88.0.64/27", ""},
	} {
		blk := &skeinv1.AddressBlock{
			ObjectMeta: metav1.ObjectMeta{
				Name:   skeinv1.BlockName(b.pool, uint32(b.index)),
				Labels: map[string]string{skeinv1.LabelPool: b.pool, skeinv1.LabelNode: b.node},
			},
			Index: b.index,
			IPv4:  ptr.To(b.v4),
		}
		if b.v6 != "" {
			blk.IPv6 = ptr.To(b.v6)
		}
		if err := c.Create(ctx, blk); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	flag := map[string]string{} // no SKEIN_SOCKET, no KUBECONFIG
	viaEnv := map[string]string{"KUBECONFIG": "/nonexistent/first" + string(filepath.ListSeparator) + kc}

	t.Run("tables", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			env  map[string]string
			args []string
			want [][]string
		}{{
			name: "pool list",
			env:  flag,
			args: []string{"--kubeconfig", kc, "pool", "list"},
			want: [][]string{
				{"NAME", "SUBNETS", "BLOCK-BITS", "BLOCKS", "USED", "CAPACITY"},
				{"default", "10.88.0.0/16", "5", "2", "0", "65536"},
				{"dual", "10.99.0.0/24, fd99::/120", "6", "1", "3", "256 v4, 256 v6"},
			},
		}, {
			name: "block list from $KUBECONFIG",
			env:  viaEnv,
			args: []string{"block", "list"},
			want: [][]string{
				{"POOL", "INDEX", "NODE", "IPV4", "IPV6", "USED", "SIZE"},
				{"default", "2", "node-a", "10.88.0.64/27", "-", "0", "32"},
				{"default", "10", "node-b", "10.88.1.64/27", "-", "0", "32"},
				{"dual", "0", "node-a", "10.99.0.0/26", "fd99::/122", "0", "64"},
			},
		}, {
			name: "block list of one pool",
			env:  flag,
			args: []string{"--kubeconfig", kc, "block", "list", "--pool", "dual"},
			want: [][]string{
				{"POOL", "INDEX", "NODE", "IPV4", "IPV6", "USED", "SIZE"},
				{"dual", "0", "node-a", "10.99.0.0/26", "fd99::/122", "0", "64"},
			},
		}} {
			t.Run(tc.name, func(t *testing.T) {
				out, errOut, code := cli(tc.env, tc.args...)
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				got := parseTable(t, out)
				if !equalRows(got, tc.want) {
					t.Errorf("got\n%q\nwant\n%q", got, tc.want)
				}
			})
		}
	})

	t.Run("show", func(t *testing.T) {
		out, errOut, code := cli(flag, "--kubeconfig", kc, "pool", "show", "dual")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		for _, want := range []string{"Name:", "dual", "10.99.0.0/24, fd99::/120", "10.99.0.1", "256 v4, 256 v6"} {
			if !strings.Contains(out, want) {
				t.Errorf("pool show lacks %q:\n%s", want, out)
			}
		}
		out, errOut, code = cli(flag, "--kubeconfig", kc, "-o", "json", "pool", "show", "default")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var p struct {
			Name    string   `json:"name"`
			Subnets []string `json:"subnets"`
			Blocks  uint32   `json:"blocks"`
		}
		if err := json.Unmarshal([]byte(out), &p); err != nil || p.Name != "default" || p.Blocks != 2 || len(p.Subnets) != 1 {
			t.Errorf("pool show -o json = %s (%v)", out, err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		unreachable := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			env  map[string]string
			args []string
			code int
			want string
		}{
			{"missing pool", flag, []string{"--kubeconfig", kc, "pool", "show", "nope"}, 1, `skeinctl: pool "nope" not found`},
			{"unreachable", flag, []string{"--kubeconfig", unreachable, "--timeout", "3s", "pool", "list"}, 1, "API server at https://127.0.0.1:1"},
			{"no kubeconfig file", flag, []string{"--kubeconfig", "/nonexistent/kubeconfig", "block", "list"}, 1, "load kubeconfig"},
			{"create refused", flag, []string{"--kubeconfig", kc, "pool", "create", "x", "--subnet", "10.1.0.0/16"}, 2, "AddressPool objects, changed with kubectl"},
			{"delete refused", viaEnv, []string{"pool", "delete", "default"}, 2, "AddressPool objects, changed with kubectl"},
			// --socket wins over $KUBECONFIG: skeind's store, not the API.
			{"socket over $KUBECONFIG", viaEnv, []string{"--socket", "/nonexistent/skeind.sock", "pool", "list"}, 1, "cannot reach skeind at /nonexistent/skeind.sock"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, errOut, code := cli(tc.env, tc.args...)
				if code != tc.code || !strings.Contains(errOut, tc.want) {
					t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
				}
			})
		}
		// The refused changes changed nothing.
		var pools skeinv1.AddressPoolList
		if err := c.List(ctx, &pools); err != nil || len(pools.Items) != 2 {
			t.Errorf("after refused changes: %d pools (%v), want the 2 made", len(pools.Items), err)
		}
	})
}

func equalRows(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], "\x00") != strings.Join(b[i], "\x00") {
			return false
		}
	}
	return true
}
