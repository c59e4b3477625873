package ipam

import (
	"math/rand/v2"
	"testing"
)

func TestBitmapCursorMovesOn(t *testing.T) {
	b := newBitmap(8)
	for want := uint32(0); want < 4; want++ {
		if got, ok := b.next(nil); !ok || got != want {
			t.Fatalf("next = %d, %v; want %d", got, ok, want)
		}
	}
	// A freed offset is not handed out again at once (coil #232).
	b.clear(1)
	for _, want := range []uint32{4, 5, 6, 7, 1} {
		if got, ok := b.next(nil); !ok || got != want {
			t.Fatalf("next = %d, %v; want %d", got, ok, want)
		}
	}
	if !b.full() {
		t.Fatal("not full")
	}
	if _, ok := b.next(nil); ok {
		t.Fatal("next on a full bitmap succeeded")
	}
	// After the wrap the cursor keeps moving forward from 2.
	b.clear(0)
	b.clear(6)
	for _, want := range []uint32{6, 0} {
		if got, ok := b.next(nil); !ok || got != want {
			t.Fatalf("next = %d, %v; want %d", got, ok, want)
		}
	}
}

func TestBitmapSetClear(t *testing.T) {
	b := newBitmap(32)
	if !b.set(3) || b.set(3) || b.used != 1 {
		t.Fatalf("set: used %d", b.used)
	}
	if !b.clear(3) || b.clear(3) || b.used != 0 {
		t.Fatalf("clear: used %d", b.used)
	}
	// next skips offsets set directly (reserved, restored).
	b.set(0)
	b.set(1)
	if got, _ := b.next(nil); got != 2 {
		t.Fatalf("next = %d, want 2", got)
	}
}

func TestBitmapFilter(t *testing.T) {
	b := newBitmap(64)
	odd := func(i uint32) bool { return i%2 == 1 }
	for i := uint32(0); i < 32; i++ {
		got, ok := b.next(odd)
		if !ok || got != 2*i+1 {
			t.Fatalf("next(odd) = %d, %v; want %d", got, ok, 2*i+1)
		}
	}
	if _, ok := b.next(odd); ok {
		t.Fatal("next(odd) found an offset when every odd one is used")
	}
	if b.full() {
		t.Fatal("full with even offsets free")
	}
	if got, ok := b.next(nil); !ok || got%2 != 0 {
		t.Fatalf("next = %d, %v", got, ok)
	}
}

// TestBitmapWordSkip fills all but one offset and checks next finds it from
// every start, at sizes below, at and above one 64-bit word.
func TestBitmapWordSkip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bits := range []int{1, 5, 6, 7, 10, 16} {
		size := uint32(1) << bits
		for trial := 0; trial < 20; trial++ {
			b := newBitmap(size)
			for i := uint32(0); i < size; i++ {
				b.set(i)
			}
			if !b.full() {
				t.Fatalf("size %d: not full", size)
			}
			if _, ok := b.next(nil); ok {
				t.Fatalf("size %d: next on full", size)
			}
			hole := rng.Uint32N(size)
			starts := []uint32{0, hole, (hole + 1) % size, size - 1, rng.Uint32N(size), hole &^ 63, (hole &^ 63) + 63}
			for _, start := range starts {
				b.clear(hole)
				b.cursor = start % size
				got, ok := b.next(nil)
				if !ok || got != hole {
					t.Fatalf("size %d cursor %d: next = %d, %v; want hole %d", size, start, got, ok, hole)
				}
				if b.cursor != (hole+1)%size {
					t.Fatalf("size %d: cursor %d after taking %d", size, b.cursor, hole)
				}
			}
		}
	}
}

// TestBitmapModel runs random operations against a plain model of the
// cursor rule: next returns the first free offset at or after the cursor,
// wrapping.
func TestBitmapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, size := range []uint32{2, 32, 64, 128, 1 << 16} {
		b := newBitmap(size)
		used := make([]bool, size)
		cursor, n := uint32(0), uint32(0)
		for op := 0; op < 20000; op++ {
			if rng.IntN(3) == 0 && n > 0 {
				i := rng.Uint32N(size)
				if b.clear(i) != used[i] {
					t.Fatalf("size %d: clear(%d) disagrees with model", size, i)
				}
				if used[i] {
					used[i] = false
					n--
				}
				continue
			}
			got, ok := b.next(nil)
			want, wantOK := uint32(0), false
			for k := uint32(0); k < size; k++ {
				if i := (cursor + k) % size; !used[i] {
					want, wantOK = i, true
					break
				}
			}
			if ok != wantOK || got != want {
				t.Fatalf("size %d op %d: next = %d, %v; model %d, %v", size, op, got, ok, want, wantOK)
			}
			if ok {
				used[got] = true
				n++
				cursor = (got + 1) % size
			}
			if b.used != n || b.full() != (n == size) {
				t.Fatalf("size %d: used %d, model %d", size, b.used, n)
			}
		}
	}
}
