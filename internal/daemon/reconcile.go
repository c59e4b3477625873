package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
)

// reconcile rebuilds skeind's view on start and removes leftovers it can
// prove are its own:
//
//  1. every stored attachment's addresses are marked used again, from the
//     record that owns them (a Borrowed record, such as a Docker
//     endpoint, routes addresses its lease owns: it is restored after the
//     owners, and holds only what no owner did);
//  2. host links skein owns (tagged, or untagged but named like skein's:
//     an ADD cut short before tagging) that no attachment claims are
//     leftovers of an interrupted ADD or DEL: they are deleted; claimed
//     untagged ones get their tag;
//  3. an attachment whose host link is gone AND whose netns path no longer
//     exists belongs to a container that is gone: it is released. One whose
//     netns still exists is kept — its runtime will DEL it, or GC will.
//  4. the export table is set to the blocks this node owns.
//
// Step 2 is refused (see checkLeftovers) when the store cannot be the one
// that describes these links, unless Config.ReconcileForce.
func (d *Daemon) reconcile(ctx context.Context) error {
	start := time.Now()
	if err := d.ipam.LoadAll(ctx); err != nil {
		return err
	}
	// The blocks the store says are this node's, before restoring
	// attachments claims any more.
	owned := d.ipam.OwnedBlocks()
	atts, err := d.st.ListAttachments(ctx)
	if err != nil {
		return err
	}
	found, err := d.dp.Scan()
	if err != nil {
		return fmt.Errorf("scan kernel: %w", err)
	}
	links := map[string]bool{}
	untagged := map[string]bool{}
	for _, f := range found {
		links[f.HostName] = true
		untagged[f.HostName] = f.Alias == ""
	}
	// Owners first, so that a borrower finds its addresses held.
	slices.SortStableFunc(atts, func(a, b store.Attachment) int {
		switch {
		case a.Borrowed == b.Borrowed:
			return 0
		case b.Borrowed:
			return -1
		}
		return 1
	})
	claimed := map[string]bool{}
	var restored, released, removed int
	for _, a := range atts {
		if !links[a.HostLink] && a.HostLink != "" && a.Owner == OwnerCNI && netns.IsNetNS(a.NetNS) != nil {
			d.log.Info("reconcile: releasing attachment of a vanished container", "key", a.AttachmentKey, "addrs", a.Addrs)
			if err := d.st.DeleteAttachment(ctx, a.AttachmentKey); err != nil {
				return err
			}
			released++
			continue
		}
		// The record claims its link whatever becomes of its addresses:
		// a live pod must not lose its interface because, say, the node
		// was renamed and its blocks cannot be claimed.
		claimed[a.HostLink] = true
		if untagged[a.HostLink] {
			if err := d.dp.Retag(a.HostLink, d.aliasFor(a.AttachmentKey)); err != nil {
				d.log.Error("reconcile: retag host link", "link", a.HostLink, "err", err)
			}
		}
		if err := d.restore(ctx, a); err != nil {
			d.log.Error("reconcile: cannot restore addresses", "key", a.AttachmentKey, "addrs", a.Addrs, "err", err)
			continue
		}
		restored++
	}
	if err := d.checkLeftovers(found, claimed, owned, len(atts)); err != nil {
		return err
	}
	for _, f := range found {
		if claimed[f.HostName] {
			continue
		}
		d.log.Info("reconcile: removing leftover link", "link", f.HostName, "alias", f.Alias)
		if err := d.dp.Teardown(f.HostName, "", "", f.Addrs); err != nil {
			d.log.Error("reconcile: remove leftover link", "link", f.HostName, "err", err)
			continue
		}
		removed++
	}
	d.exportBlocks()
	d.log.Info("reconciled", "attachments", restored, "released", released, "leftoverLinks", removed, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// restore marks a's addresses used again. An owner's address found held
// already is an error (two records claim it). A borrower's addresses are
// normally held by their owner already; one that is not (its lease is
// gone, but a link still routes it) is held too, so it is not handed out
// while routed, and stays held until the next start.
func (d *Daemon) restore(ctx context.Context, a store.Attachment) error {
	err := d.ipam.Restore(ctx, a.Pool, a.Addrs)
	if !a.Borrowed {
		return err
	}
	var dup *ipam.DupError
	if !errors.As(err, &dup) {
		return err
	}
	var orphans []netip.Addr
	for _, ad := range a.Addrs {
		if !slices.Contains(dup.Addrs, ad.Unmap()) {
			orphans = append(orphans, ad)
		}
	}
	if len(orphans) > 0 {
		d.log.Warn("reconcile: no record owns addresses this link routes; holding them", "key", a.AttachmentKey, "addrs", orphans)
	}
	return nil
}

// ErrStoreMismatch: reconcile found host links the store cannot account
// for and did not delete them (Config.ReconcileForce overrides).
var ErrStoreMismatch = errors.New("the store does not describe this node's attachments")

// checkLeftovers decides whether the links no record claims may be deleted.
//
// A leftover of an interrupted ADD is a link whose record never became
// durable. Its addresses were allocated before it was plumbed, and
// allocating claims the address's block in the store first, so every
// address such a link routes lies in a block the store says this node
// owns. A link routing an address outside all of them is not a leftover:
// the store is not the one these links were made with — it is new or
// empty (state directory moved, deleted, or a typo in --state-dir), or a
// copy older than the kernel state. Deleting would cut every running
// workload on the node off the network, so reconcile refuses and says so,
// whatever the number of such links; one is already proof. An empty store
// meeting any tagged link that routes an address is this case. Counting
// links instead (refusing above some number, or when most links are
// unclaimed) would also refuse after an ordinary crash with many ADDs in
// flight, keeping the node down exactly when it should recover alone, and
// would let a small node with a lost store delete its few pods' links.
// The rule cannot tell a copy of the store that already owned a link's
// block from a crash; such links are deleted as leftovers.
func (d *Daemon) checkLeftovers(found []dataplane.Found, claimed map[string]bool, owned []netip.Prefix, records int) error {
	var foreign []dataplane.Found
	for _, f := range found {
		if claimed[f.HostName] {
			continue
		}
		for _, a := range f.Addrs {
			if !slices.ContainsFunc(owned, func(p netip.Prefix) bool { return p.Contains(a) }) {
				foreign = append(foreign, f)
				break
			}
		}
	}
	if len(foreign) == 0 {
		return nil
	}
	var examples []string
	for i, f := range foreign {
		if i == 3 {
			examples = append(examples, fmt.Sprintf("and %d more", len(foreign)-3))
			break
		}
		examples = append(examples, fmt.Sprintf("%s %q routing %v", f.HostName, f.Alias, f.Addrs))
	}
	if d.cfg.ReconcileForce {
		d.log.Warn("reconcile: deleting host links the store does not know, as --reconcile-force asks",
			"links", len(foreign), "examples", strings.Join(examples, "; "))
		return nil
	}
	err := fmt.Errorf("%w: %d host link(s) route addresses outside every block the store (%s, %d attachment records) gives node %q: %s; "+
		"they are not leftovers of an interrupted ADD, so the store is new, empty, moved or older than the kernel state. "+
		"No host link was deleted. Point skeind at the store these attachments were made with, or restart it with --reconcile-force to delete them",
		ErrStoreMismatch, len(foreign), d.st.Describe(), records, d.cfg.Node, strings.Join(examples, "; "))
	d.log.Error("reconcile: refusing to delete host links the store does not know", "err", err)
	return err
}
