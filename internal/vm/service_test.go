package vm

import (
	"fmt"
	"testing"
)

// TestServiceLocksDoNotGrow: the per-attachment locks of the VM front door
// are dropped once released; they used to stay, one per key ever seen.
func TestServiceLocksDoNotGrow(t *testing.T) {
	s := &Service{}
	for i := range 1000 {
		unlock := s.lock(fmt.Sprintf("net/ctr-%d/eth0", i))
		unlock()
	}
	if n := s.locks.Len(); n != 0 {
		t.Errorf("after 1000 distinct keys locked and unlocked, %d lock entries remain; want 0", n)
	}
}
