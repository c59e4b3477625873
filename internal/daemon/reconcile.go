package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

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
func (d *Daemon) reconcile(ctx context.Context) error {
	start := time.Now()
	if err := d.ipam.LoadAll(ctx); err != nil {
		return err
	}
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
