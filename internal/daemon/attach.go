package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// ErrAttachmentExists: ADD for a key that is already attached.
var ErrAttachmentExists = errors.New("attachment already exists")

// AttachRequest is what every front door asks for: one routed veth into a
// network namespace with addresses from a pool.
type AttachRequest struct {
	Key    store.AttachmentKey
	Pool   string
	NetNS  string
	Static []netip.Addr
	Within []netip.Prefix
	MTU    int
	Owner  string
	// IPv4, IPv6 select families (both false: all the pool has).
	IPv4, IPv6 bool
}

// HostLinkName derives the host-side veth name of an attachment: short
// enough for IFNAMSIZ, stable so DEL finds it without the store.
func HostLinkName(k store.AttachmentKey) string {
	h := sha256.Sum256([]byte(k.Network + "\x00" + k.ContainerID + "\x00" + k.IfName))
	return dataplane.HostNamePrefix + hex.EncodeToString(h[:6])
}

// aliasFor is the ownership tag written on the host veth (the Docker
// front door tags its endpoints the same way, so reconcile can retag them).
func (d *Daemon) aliasFor(k store.AttachmentKey) string {
	return dataplane.AttachmentAlias(d.dpConfig.AliasPrefix, k.Network, k.ContainerID, k.IfName)
}

func randomMAC() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	b[0] = b[0]&^0x01 | 0x02 // unicast, locally administered
	return net.HardwareAddr(b[:]).String()
}

// Attach allocates addresses, records the attachment and plumbs it. Every
// failure path undoes what it did: no link, no address held, no record.
//
// The record is written to the store while the kernel is being programmed,
// in parallel: the fsync and the netlink work overlap instead of adding up.
// That stays crash-safe because the reply waits for both: if skeind dies
// after plumbing but before the record is durable, the next start finds a
// tagged link that no record claims and deletes it (reconcile) before it
// serves, so the address it carried is free again and nobody was told it
// was theirs. If it dies after the record but before plumbing, the record
// holds the address until the runtime's DEL or GC.
func (d *Daemon) Attach(ctx context.Context, r AttachRequest) (a store.Attachment, ap dataplane.Applied, err error) {
	defer d.adds.begin(r.Key.String())()
	unlock := d.locks.Lock(r.Key.String())
	defer unlock()

	if _, err := d.st.GetAttachment(ctx, r.Key); err == nil {
		return a, ap, fmt.Errorf("%w: %s (DEL it first)", ErrAttachmentExists, r.Key)
	} else if !errors.Is(err, store.ErrNotFound) {
		return a, ap, err
	}

	// 1. addresses
	addrs, err := d.ipam.Allocate(ctx, ipam.Request{Pool: r.Pool, Static: r.Static, Within: r.Within, IPv4: r.IPv4, IPv6: r.IPv6})
	if err != nil {
		return a, ap, err
	}
	bg := context.WithoutCancel(ctx)
	undoFailed := false
	defer func() {
		// If undoing failed, a link or a record may still claim the
		// addresses: leaking them is better than handing them out twice.
		if err != nil && !undoFailed {
			d.ipam.Release(bg, r.Pool, addrs)
		}
	}()

	// 2. the durable record, written while 3. programs the kernel
	a = store.Attachment{
		AttachmentKey: r.Key,
		Pool:          r.Pool,
		Addrs:         addrs,
		NetNS:         r.NetNS,
		HostLink:      HostLinkName(r.Key),
		ContainerMAC:  randomMAC(),
		Owner:         r.Owner,
		Created:       time.Now().UTC(),
	}
	stored := make(chan error, 1)
	go func() { stored <- d.st.PutAttachment(bg, a) }()

	// 3. the kernel
	mac, _ := net.ParseMAC(a.ContainerMAC)
	ap, setupErr := d.dp.Setup(dataplane.Link{
		HostName:     a.HostLink,
		Alias:        d.aliasFor(r.Key),
		NetNS:        r.NetNS,
		IfName:       r.Key.IfName,
		Addrs:        addrs,
		MTU:          r.MTU,
		ContainerMAC: mac,
	})
	storeErr := <-stored

	switch {
	case setupErr == nil && storeErr == nil:
		return a, ap, nil
	case setupErr == nil:
		if terr := d.dp.Teardown(a.HostLink, "", "", addrs); terr != nil {
			undoFailed = true
			d.log.Error("undo setup after store failure; its addresses stay held", "key", r.Key, "err", terr)
		}
	case errors.Is(setupErr, dataplane.ErrUndoFailed):
		// The kernel may still route the addresses to a link Setup could
		// not delete: they stay held, and so does the record (if it was
		// written), so that the DEL the runtime sends after a failed ADD
		// tears the link down and only then frees them.
		undoFailed = true
		d.log.Error("setup failed and so did its undo; the addresses stay held until DEL", "key", r.Key, "err", setupErr)
	case storeErr == nil:
		if derr := d.st.DeleteAttachment(bg, r.Key); derr != nil {
			undoFailed = true
			d.log.Error("undo record after setup failure; its addresses stay held", "key", r.Key, "err", derr)
		}
	}
	if storeErr != nil {
		if errors.Is(storeErr, store.ErrExists) {
			return a, ap, fmt.Errorf("%w: %s (DEL it first)", ErrAttachmentExists, r.Key)
		}
		if setupErr == nil {
			return a, ap, fmt.Errorf("record attachment: %w", storeErr)
		}
	}
	return a, ap, setupErr
}

// Detach removes an attachment: kernel first, then the record, then the
// addresses, so that a crash in between leaves a record that points at what
// may still exist. It succeeds when things are already gone. found reports
// whether a record existed.
func (d *Daemon) Detach(ctx context.Context, k store.AttachmentKey, netnsHint string) (found bool, err error) {
	unlock := d.locks.Lock(k.String())
	defer unlock()
	return d.detachLocked(ctx, k, netnsHint)
}

// Collect removes the attachment of key k for GC, unless it is not
// garbage from the point of view of a GC request that started at since:
// an ADD of k is running (busy: the keys running when the request
// started), or the record was created at or after since (an ADD the
// runtime could not have listed). removed reports whether it went.
func (d *Daemon) Collect(ctx context.Context, k store.AttachmentKey, netnsHint string, since time.Time, busy map[string]bool) (removed bool, err error) {
	if busy[k.String()] {
		return false, nil
	}
	unlock := d.locks.Lock(k.String())
	defer unlock()
	a, err := d.st.GetAttachment(ctx, k)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil // DEL was first
	}
	if err != nil {
		return false, err
	}
	if !a.Created.Before(since) {
		return false, nil
	}
	return d.detachLocked(ctx, k, netnsHint)
}

func (d *Daemon) detachLocked(ctx context.Context, k store.AttachmentKey, netnsHint string) (bool, error) {
	a, err := d.st.GetAttachment(ctx, k)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	found := err == nil
	// The host link's name derives from the key, so it is all Teardown
	// needs. (Its fallback of finding the host end from the pod's ifname
	// must not be used: without a record, the pod's interface of that name
	// may belong to another network's attachment.)
	_ = netnsHint
	host := HostLinkName(k)
	if found && a.HostLink != "" {
		host = a.HostLink
	}
	if err := d.dp.Teardown(host, "", "", a.Addrs); err != nil {
		return found, fmt.Errorf("tear down %s: %w", k, err)
	}
	if !found {
		return false, nil
	}
	if err := d.st.DeleteAttachment(ctx, k); err != nil {
		return true, fmt.Errorf("delete record of %s: %w", k, err)
	}
	if !a.Borrowed {
		d.ipam.Release(ctx, a.Pool, a.Addrs)
	}
	return true, nil
}
