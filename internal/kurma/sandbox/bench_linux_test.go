package sandbox

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkCall is one sandboxed add of the test plugin ("ok" mode: read the
// config, print a result) against exec'ing the same static binary directly
// with the same stdin and arguments: the difference is the sandbox's cost
// (starting the init, namespaces, the mounts, pivot_root, teardown). The
// init is either this test binary re-executed or the dedicated
// skein-sandbox-init (skeind re-executed would start slower still: a large
// binary with many package initialisers), started for the call (cold) or
// ahead of it (warm: the call only pays for the mounts).
func BenchmarkCall(b *testing.B) {
	e := newEnv(b, Options{})
	cfg := []byte(`{"mode":"ok"}`)
	sandboxed := func(sb *Sandbox) func(b *testing.B) {
		return func(b *testing.B) {
			spec := e.spec(string(cfg))
			for b.Loop() {
				res, err := sb.Run(context.Background(), spec)
				if err != nil || !bytes.Contains(res.Stdout, []byte("10.1.2.3/24")) {
					b.Fatal(err, string(res.Stdout))
				}
			}
		}
	}
	for _, c := range []struct {
		name     string
		init     string
		prestart int
	}{
		{"sandboxed-reexec-cold", "/proc/self/exe", -1},
		{"sandboxed-init-binary-cold", initBin, -1},
		{"sandboxed-reexec-warm", "/proc/self/exe", 2},
		{"sandboxed-init-binary-warm", initBin, 2},
	} {
		sb, err := New(Options{ScratchDir: e.sb.opts.ScratchDir, InitPath: c.init, Prestart: c.prestart})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, sandboxed(sb))
		sb.Close()
	}
	// Back to back, a warm call's replacement init starts while the next
	// call runs and competes for the CPUs; attaches are rarely that dense.
	// With the pool full before each call (not timed), a warm call's
	// latency alone:
	b.Run("sandboxed-init-binary-warm-idle", func(b *testing.B) {
		sb, err := New(Options{ScratchDir: e.sb.opts.ScratchDir, InitPath: initBin, Prestart: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		spec := e.spec(string(cfg))
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			for len(sb.pool.ready) == 0 {
				time.Sleep(100 * time.Microsecond)
			}
			time.Sleep(2 * time.Millisecond) // let the filler finish
			b.StartTimer()
			if _, err := sb.Run(context.Background(), spec); err != nil {
				b.Fatal(err)
			}
		}
		if n := sb.pool.cold.Load(); n != 0 {
			b.Fatalf("%d calls started cold", n)
		}
	})
	// The same with an init prepared for the call's layout (the network's
	// image, state and netns directories): the call sends the executable
	// and pays for no mount.
	b.Run("sandboxed-init-binary-prepared-idle", func(b *testing.B) {
		sb, err := New(Options{ScratchDir: e.sb.opts.ScratchDir, InitPath: initBin, Prestart: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		spec := e.spec(string(cfg))
		if _, err := sb.Run(context.Background(), spec); err != nil {
			b.Fatal(err)
		}
		key := layoutKey(b, sb, spec)
		prep := sb.pool.prep.Load()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			for sb.prepared.count(key) == 0 {
				time.Sleep(100 * time.Microsecond)
			}
			time.Sleep(2 * time.Millisecond) // let the filler finish
			b.StartTimer()
			if _, err := sb.Run(context.Background(), spec); err != nil {
				b.Fatal(err)
			}
		}
		if n := sb.pool.prep.Load() - prep; n != int64(b.N) {
			b.Fatalf("%d of %d calls used a prepared init", n, b.N)
		}
	})
	b.Run("direct-idle", func(b *testing.B) {
		bin := filepath.Join(e.rootfs, "opt/network/add")
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			time.Sleep(2 * time.Millisecond)
			b.StartTimer()
			cmd := exec.Command(bin, e.netns, "146d7cef-fbf6-41da-a2f8-eba218597f9c", "eth0")
			cmd.Stdin = bytes.NewReader(cfg)
			if out, err := cmd.Output(); err != nil || !bytes.Contains(out, []byte("10.1.2.3/24")) {
				b.Fatal(err, string(out))
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		bin := filepath.Join(e.rootfs, "opt/network/add")
		for b.Loop() {
			cmd := exec.Command(bin, e.netns, "146d7cef-fbf6-41da-a2f8-eba218597f9c", "eth0")
			cmd.Stdin = bytes.NewReader(cfg)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil || !bytes.Contains(out.Bytes(), []byte("10.1.2.3/24")) {
				b.Fatal(err, out.String())
			}
		}
	})
}
