package ipam

// bitmap is a fixed-size set of offsets with a cursor. Allocation searches
// forward from the cursor and wraps, so a freed offset is not reused until
// every other free offset has been handed out (coil #232: a runtime that
// still holds a stale view of a dead pod's address must not meet a new pod
// there at once).
type bitmap struct {
	words  []uint64
	size   uint32
	used   uint32
	cursor uint32
}

func newBitmap(size uint32) *bitmap {
	return &bitmap{words: make([]uint64, (size+63)/64), size: size}
}

func (b *bitmap) test(i uint32) bool { return b.words[i/64]&(1<<(i%64)) != 0 }

// set marks i used; it reports false if it already was.
func (b *bitmap) set(i uint32) bool {
	if b.test(i) {
		return false
	}
	b.words[i/64] |= 1 << (i % 64)
	b.used++
	return true
}

// clear marks i free; it reports false if it already was.
func (b *bitmap) clear(i uint32) bool {
	if !b.test(i) {
		return false
	}
	b.words[i/64] &^= 1 << (i % 64)
	b.used--
	return true
}

func (b *bitmap) full() bool { return b.used >= b.size }

// next finds a free offset at or after the cursor (wrapping) for which ok
// (nil = any) holds, marks it used and moves the cursor past it.
func (b *bitmap) next(ok func(uint32) bool) (uint32, bool) {
	if b.full() {
		return 0, false
	}
	i := b.cursor % b.size
	for n := uint32(0); n < b.size; {
		// A word with every bit used is skipped whole.
		if i%64 == 0 && i+64 <= b.size && b.words[i/64] == ^uint64(0) {
			n += 64
			i = (i + 64) % b.size
			continue
		}
		if !b.test(i) && (ok == nil || ok(i)) {
			b.set(i)
			b.cursor = (i + 1) % b.size
			return i, true
		}
		n++
		i = (i + 1) % b.size
	}
	return 0, false
}
