package daemon

import "sync"

// inflight counts the Attach calls running per attachment key, so that GC
// can leave alone an attachment whose ADD has not returned yet: its record
// is written while the kernel is being programmed, before the runtime
// knows the attachment exists.
type inflight struct {
	mu sync.Mutex
	m  map[string]int
}

// begin marks an Attach of key running; the returned func ends it.
func (f *inflight) begin(key string) func() {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]int{}
	}
	f.m[key]++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.m[key]--; f.m[key] == 0 {
			delete(f.m, key)
		}
		f.mu.Unlock()
	}
}

// snapshot returns the keys with an Attach running now.
func (f *inflight) snapshot() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]bool, len(f.m))
	for k := range f.m {
		out[k] = true
	}
	return out
}
