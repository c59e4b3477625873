package vm

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFrontDoorNotOnDaemon: the VM front door depends on the narrow Host
// interface, not on internal/daemon (which hosts it), as the Docker front
// door does; skeind's wiring (cmd/skeind) is the only place both meet.
func TestFrontDoorNotOnDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/skeinnet/skein/internal/daemon" {
			t.Errorf("internal/vm imports %s (directly or through its dependencies); depend on vm.Host instead", dep)
		}
	}
}
