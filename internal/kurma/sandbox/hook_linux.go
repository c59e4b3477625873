package sandbox

import "github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"

// MaybeRunInit turns the process into a sandbox's init when it was started as
// one (by Sandbox.Run or a Supervisor re-executing this binary), and never
// returns in that case; in every other process it returns at once. Importing
// this package already runs it (package sandboxinit's init function), so a
// binary cannot forget it; calling it first thing in main or TestMain is
// harmless and documents the re-exec.
func MaybeRunInit() { sandboxinit.MaybeRun() }
