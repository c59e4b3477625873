package daemon

import (
	"net/netip"

	"github.com/skeinnet/skein/internal/dataplane"
)

// Kernel is what skeind, and the front doors it hosts, need from the
// dataplane (*dataplane.Dataplane in production; a fake in unit tests).
// Every call is synchronous and safe for concurrent use. Errors are
// dataplane errors: callers branch with errors.Is on the dataplane
// sentinels (ErrLinkExists, ErrNotOwned, ErrUndoFailed, …).
type Kernel interface {
	// Init programs the node's base state (rules, gateway route,
	// forwarding); safe to repeat.
	Init() error
	// Setup plumbs one attachment, all or nothing; a failure whose undo
	// also failed wraps dataplane.ErrUndoFailed (the link may remain).
	Setup(dataplane.Link) (dataplane.Applied, error)
	// SetupPair plumbs a pair with both ends in the node (Docker).
	SetupPair(dataplane.Pair) (dataplane.Applied, error)
	// Teardown removes an attachment's host link; nil when already gone.
	Teardown(hostName, netnsPath, ifName string, addrs []netip.Addr) error
	// Check compares the kernel with l (dataplane.ErrMismatch).
	Check(l dataplane.Link) error
	// Scan lists every host link skein owns, with its routed addresses.
	Scan() ([]dataplane.Found, error)
	// Retag sets the ownership alias of an owned host link.
	Retag(hostName, alias string) error
	// SetExportedBlocks makes the export table hold exactly blocks.
	SetExportedBlocks(blocks []netip.Prefix) error
	// Config is the configuration with its defaults filled in.
	Config() dataplane.Config
	// Close releases the kernel handles; the kernel state stays.
	Close() error
}

var _ Kernel = (*dataplane.Dataplane)(nil)
