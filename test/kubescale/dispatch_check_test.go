package kubescale

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// TestDispatcher: a node's handler registered through the dispatcher gets
// an initial add for each block of its node already there, then every
// add, update and delete of a block that names the node in its nodeName
// or label, before or after the change (a block given to another node
// included), and nothing about other nodes' blocks.
func TestDispatcher(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	env := kube.Start(t, kube.Options{})
	ctx := context.Background()
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	block := func(name, node string) *skeinv1.AddressBlock {
		return &skeinv1.AddressBlock{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{skeinv1.LabelPool: "p", skeinv1.LabelNode: node}},
			NodeName:   node,
			Index:      int64(name[len(name)-1] - '0'),
		}
	}
	if err := admin.Create(ctx, block("p-0", "a")); err != nil {
		t.Fatal(err)
	}
	shared := sharedCache(t, env, false)
	d, err := newDispatcher(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	rec := func(what string) func(any) {
		return func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			mu.Lock()
			got = append(got, what+" "+o.(*skeinv1.AddressBlock).Name)
			mu.Unlock()
		}
	}
	inf, err := (&nodeCache{Cache: shared, node: "a", d: d}).GetInformer(ctx, &skeinv1.AddressBlock{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    rec("add"),
		UpdateFunc: func(_, o any) { rec("update")(o) },
		DeleteFunc: rec("delete"),
	})
	if err != nil || !reg.HasSynced() {
		t.Fatalf("register: %v, synced %t", err, reg.HasSynced())
	}

	for _, b := range []*skeinv1.AddressBlock{block("p-1", "a"), block("p-2", "b")} {
		if err := admin.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	// p-2 relabelled to a (its nodeName stays b): a hears of it; then p-1
	// and p-2 deleted; then a block of b alone, which a never hears of.
	p2 := &skeinv1.AddressBlock{}
	if err := admin.Get(ctx, clientKey("p-2"), p2); err != nil {
		t.Fatal(err)
	}
	p2.Labels[skeinv1.LabelNode] = "a"
	if err := admin.Update(ctx, p2); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"p-1", "p-2"} {
		if err := admin.Delete(ctx, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Create(ctx, block("p-3", "b")); err != nil {
		t.Fatal(err)
	}
	// The dispatcher's own handler sees p-3 after everything before it.
	want := []string{"add p-0", "add p-1", "update p-2", "delete p-1", "delete p-2"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(got) >= len(want)
		cur := slices.Clone(got)
		mu.Unlock()
		var seen skeinv1.AddressBlock
		if done && shared.Get(ctx, clientKey("p-3"), &seen) == nil {
			time.Sleep(200 * time.Millisecond) // anything about p-3 would have come by now
			mu.Lock()
			cur = slices.Clone(got)
			mu.Unlock()
			if !slices.Equal(cur, want) {
				t.Errorf("node a's handler got %q, want %q", cur, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node a's handler got %q, want %q", cur, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := inf.RemoveEventHandler(reg); err != nil {
		t.Fatal(err)
	}
	if n := len(d.regs([]string{"a"})); n != 0 {
		t.Errorf("%d handlers of a left after RemoveEventHandler", n)
	}
}

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }
