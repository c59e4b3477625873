package image

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// benchEnts is a 5 MiB plugin image: one 3 MiB "binary", 128 files of
// 16 KiB, links, directories; the data is random so that gzip cannot
// shrink it away.
func benchEnts() ([]ent, int64) {
	rng := rand.New(rand.NewPCG(1, 2))
	blob := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return string(b)
	}
	es := append(pluginEnts(), dir("bin/"), exe("bin/plugin", blob(3<<20)), dir("lib/"))
	total := int64(3 << 20)
	for i := range 128 {
		es = append(es, file(fmt.Sprintf("lib/f%03d", i), blob(16<<10)))
		total += 16 << 10
	}
	for i := range 32 {
		es = append(es, symlink(fmt.Sprintf("bin/l%02d", i), "/bin/plugin"))
	}
	return es, total
}

// BenchmarkUnpack measures a cold Acquire of a 5 MiB image (fetch,
// checks, unpack, syncfs, rename) per source format; the image is pruned
// between iterations, outside the timer.
func BenchmarkUnpack(b *testing.B) {
	es, total := benchEnts()
	top := b.TempDir()
	img := mkImage(b, mkTar(b, es...))
	sources := map[string]string{
		"oci-layout":  "file://" + writeLayout(b, filepath.Join(top, "layout"), img),
		"docker-save": "file://" + writeDockerSave(b, filepath.Join(top, "d.tar"), img),
		"aci-gz":      "file://" + writeACI(b, filepath.Join(top, "p.aci"), es, true),
	}
	for _, n := range []string{"oci-layout", "docker-save", "aci-gz"} {
		b.Run(n, func(b *testing.B) {
			benchAcquire(b, Source{Image: sources[n]}, total)
		})
	}
	b.Run("registry", func(b *testing.B) {
		reg := startRegistry(b)
		d := push(b, reg.host+"/skein/bench:v1", img)
		benchAcquire(b, Source{Image: "docker://" + reg.host + "/skein/bench@" + d.String()}, total)
	})
}

func benchAcquire(b *testing.B, src Source, total int64) {
	cache := newCache(b, Options{})
	b.SetBytes(total)
	for b.Loop() {
		_, release, err := acquire(b, cache, src)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		release()
		if _, err := cache.Prune(nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkAcquireCached is the cost of Acquire for a pinned image that
// is already unpacked (the common case of every attach).
func BenchmarkAcquireCached(b *testing.B) {
	es, _ := benchEnts()
	img := mkImage(b, mkTar(b, es...))
	src := writeLayout(b, filepath.Join(b.TempDir(), "layout"), img)
	cache := newCache(b, Options{})
	s := Source{Image: "file://" + src, Digest: digestOf(b, img).String()}
	if _, release, err := acquire(b, cache, s); err != nil {
		b.Fatal(err)
	} else {
		release()
	}
	for b.Loop() {
		_, release, err := acquire(b, cache, s)
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}
