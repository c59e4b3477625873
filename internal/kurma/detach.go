package kurma

import (
	"context"
	"errors"
	"fmt"

	"github.com/skeinnet/skein/internal/kurma/image"
)

// detachOne runs a's del and removes it from the record (rec is updated
// and written). If the del fails the entry stays, marked StateDelFailed.
func (m *Manager) detachOne(ctx context.Context, rec *PodRecord, a AttachmentRecord) error {
	delErr := m.del(ctx, rec, a)
	for i := range rec.Attachments {
		if rec.Attachments[i].Network != a.Network {
			continue
		}
		if delErr != nil {
			rec.Attachments[i].State = StateDelFailed
			rec.Attachments[i].Error = delErr.Error()
		} else {
			rec.Attachments = append(rec.Attachments[:i], rec.Attachments[i+1:]...)
		}
		break
	}
	if err := m.putRecord(ctx, rec); err != nil {
		return errors.Join(delErr, err)
	}
	return delErr
}

// Detach removes all of a pod's networks, those of every record of the
// pod, each record's in reverse order of attachment, each del from its
// record (the config and image it was added with). It is idempotent: a pod
// without a record is already detached. If some del fails, the others
// still run, the failed ones stay recorded, and the error lists them.
func (m *Manager) Detach(ctx context.Context, id string) error {
	if err := checkPod(id, ""); err != nil {
		return err
	}
	recs, err := m.listRecords(ctx)
	if err != nil {
		return err
	}
	keys := []string{id}
	for _, r := range recs {
		if r.ID == id && r.StoreKey() != id {
			keys = append(keys, r.StoreKey())
		}
	}
	var errs []error
	for _, k := range keys {
		if _, err := m.DetachIf(ctx, k, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DetachIf detaches the networks of the record stored under key (a pod's
// ID or an AttachRequest.Key) when still, given the record as it is once
// the pod's calls are serialized, says so (nil: always). A collector checks
// there that the record it decided on is the one it removes, not the same
// pod attached again since. It reports whether it detached; a key with no
// record is already detached.
func (m *Manager) DetachIf(ctx context.Context, key string, still func(PodRecord) bool) (bool, error) {
	return m.detach(ctx, key, still, nil)
}

// DetachLost is DetachIf of req's record for a front door that knows what
// the pod asked for (the CNI meta mode's DEL, which may come after the
// store lost the record). With a record it is DetachIf. Without one it
// frees what it still
// can, under the pod's lock (no attach of the pod runs meanwhile): first
// orphans (the caller's: what skeind's own pools hold for the pod), then,
// in reverse order, a del of each image network of req.Networks (the
// defaults when empty) from the current config, each failure logged (a
// del is idempotent; the network may have changed since). A pod in no
// config and no record has nothing left to do.
func (m *Manager) DetachLost(ctx context.Context, req AttachRequest, orphans func(context.Context) error) error {
	_, err := m.detach(ctx, req.key(), nil, func() error {
		var err error
		if orphans != nil {
			err = orphans(ctx)
		}
		m.delUnrecorded(ctx, req)
		return err
	})
	return err
}

// delUnrecorded runs the best-effort dels of DetachLost.
func (m *Manager) delUnrecorded(ctx context.Context, req AttachRequest) {
	nets := m.Networks()
	sels := req.Networks
	if len(sels) == 0 {
		for _, name := range Defaults(nets) {
			sels = append(sels, Selection{Network: name})
		}
	}
	rec := PodRecord{ID: req.ID, NetNS: req.NetNS}
	for i := len(sels) - 1; i >= 0; i-- {
		n, ok := Find(nets, sels[i].Network)
		if !ok || n.Builtin() {
			continue
		}
		ifname := sels[i].IfName
		if ifname == "" {
			// As the add rendered it, unless the template is random.
			ifname, _ = RenderIfName(n.ContainerInterface, req.ID, i, map[string]bool{})
		}
		// Only an image at hand: a DEL never waits on a registry.
		digest := n.Ref.Digest.String()
		m.mu.Lock()
		if s := m.active[n.Name]; s != nil && string(s.raw) == string(n.Raw) {
			digest = s.img.Digest
		}
		m.mu.Unlock()
		var err error
		switch {
		case n.Ref.Pinned() || digest != n.Ref.Digest.String():
			a := AttachmentRecord{Network: n.Name, IfName: ifname, Config: n.Raw, Image: n.Image,
				Digest: digest, Insecure: n.Ref.Insecure, Timeout: n.Timeout}
			err = m.del(ctx, &rec, a)
		case n.Ref.Scheme == image.SchemeFile:
			// An unpinned local archive, pruned with the record that
			// was lost: reading it again needs no network, only its
			// timeout.
			err = m.delLostLocal(ctx, &rec, n, ifname)
		default:
			err = fmt.Errorf("image %s: not pinned and not in use: %w", n.Image, ErrImageGone)
		}
		if err != nil {
			m.log.Warn("del of an unrecorded pod network failed", "pod", req.ID, "network", n.Name, "err", err)
		}
	}
}

// delLostLocal runs network n's del for a pod without a record when n's
// image is an unpinned file:// archive no longer in the cache: the
// archive is read again (bounded by n's timeout), the del run, the image
// released.
func (m *Manager) delLostLocal(ctx context.Context, rec *PodRecord, n Network, ifname string) error {
	tctx, cancel := context.WithTimeout(ctx, n.Timeout)
	st, release, err := m.ensure(tctx, n)
	cancel()
	if err != nil {
		return fmt.Errorf("image %s: read it again for the del: %w", n.Image, err)
	}
	defer release()
	a := AttachmentRecord{Network: n.Name, IfName: ifname, Config: n.Raw, Image: n.Image,
		Digest: st.img.Digest, Insecure: n.Ref.Insecure, Timeout: n.Timeout}
	return m.del(ctx, rec, a)
}

// detach is DetachIf; lost, when set, runs under the pod's lock if there
// is no record under key.
func (m *Manager) detach(ctx context.Context, key string, still func(PodRecord) bool, lost func() error) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	id := podOfKey(key)
	unlock := m.locks.Lock(id)
	defer unlock()
	rec, found, err := m.getRecord(ctx, key)
	if err == nil && !found && lost != nil {
		err = lost()
	}
	if err != nil || !found {
		return false, err
	}
	if still != nil && !still(rec) {
		return false, nil
	}
	// Once begun, a detach runs to its end: a del cut short, or a record
	// not updated after a del that ran, would only leave work for a retry
	// (the plugin calls have their own timeouts).
	bg := context.WithoutCancel(ctx)
	var errs []error
	var gone []string // digests of the images of the entries deleted
	for i := len(rec.Attachments) - 1; i >= 0; i-- {
		a := rec.Attachments[i]
		if err := m.dropEntry(bg, &rec, i, true); err != nil {
			errs = append(errs, fmt.Errorf("detach pod %s from network %q: %w", id, a.Network, err))
		} else if a.Digest != "" {
			gone = append(gone, a.Digest)
		}
	}
	// One write for the whole pod: the record goes, or keeps the entries
	// whose del failed. A crash before it leaves the record as it was, and
	// the next detach dels again (a del of what is gone succeeds).
	compact(&rec)
	if err := m.putRecord(bg, &rec); err != nil {
		errs = append(errs, err)
	}
	if m.prunable(gone) {
		m.prune(bg)
	}
	return true, errors.Join(errs...)
}
