package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Status returns the pod's networks: its record, or when it has several
// (AttachRequest.Key), one record holding the attachments of them all, in
// the order they were made. ErrUnknownPod when it has none.
func (m *Manager) Status(ctx context.Context, id string) (PodRecord, error) {
	if err := checkPod(id, ""); err != nil {
		return PodRecord{}, err
	}
	rec, found, err := m.getRecord(ctx, id)
	if err != nil {
		return rec, err
	}
	recs, err := m.listRecords(ctx)
	if err != nil {
		return PodRecord{}, err
	}
	for _, r := range recs {
		if r.ID != id || r.StoreKey() == id {
			continue
		}
		if !found {
			rec, found = PodRecord{ID: id, NetNS: r.NetNS, Owner: r.Owner, Created: r.Created}, true
		}
		rec.Attachments = append(rec.Attachments, r.Attachments...)
		if r.Created.Before(rec.Created) {
			rec.Created = r.Created
		}
	}
	if !found {
		return rec, fmt.Errorf("pod %s: %w", id, ErrUnknownPod)
	}
	slices.SortStableFunc(rec.Attachments, func(a, b AttachmentRecord) int { return a.Created.Compare(b.Created) })
	return rec, nil
}

// Record returns the record stored under key (a pod's ID or an
// AttachRequest.Key); ErrUnknownPod when there is none.
func (m *Manager) Record(ctx context.Context, key string) (PodRecord, error) {
	if err := checkKey(key); err != nil {
		return PodRecord{}, err
	}
	rec, found, err := m.getRecord(ctx, key)
	if err != nil {
		return rec, err
	}
	if !found {
		return rec, fmt.Errorf("pod record %s: %w", key, ErrUnknownPod)
	}
	return rec, nil
}

// List returns every pod record.
func (m *Manager) List(ctx context.Context) ([]PodRecord, error) {
	return m.listRecords(ctx)
}

// Recover finishes what a crash interrupted: entries still StateAdding
// (an add that never reported) are deleted and dropped; then unused images
// are pruned. Call it once at start, before serving.
func (m *Manager) Recover(ctx context.Context) error {
	recs, err := m.listRecords(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		unlock := m.locks.Lock(r.ID)
		rec, found, err := m.getRecord(ctx, r.StoreKey())
		if err == nil && found {
			for i := len(rec.Attachments) - 1; i >= 0; i-- {
				if a := rec.Attachments[i]; a.State == StateAdding {
					if derr := m.detachOne(ctx, &rec, a); derr != nil {
						errs = append(errs, fmt.Errorf("roll back interrupted add of pod %s to %q: %w", r.ID, a.Network, derr))
					}
				}
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.sweepCompletions(ctx); err != nil {
		errs = append(errs, fmt.Errorf("sweep pod records' completions: %w", err))
	}
	m.prune(ctx)
	return errors.Join(errs...)
}

// GC detaches every pod record for which keep (given the pod's ID)
// returns false and that was created before since (a pod attached after
// the caller took its list is not garbage). It returns the pods detached.
func (m *Manager) GC(ctx context.Context, since time.Time, keep func(id string) bool) ([]string, error) {
	recs, err := m.listRecords(ctx)
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, r := range recs {
		if keep(r.ID) || !r.Created.Before(since) {
			continue
		}
		detached, err := m.DetachIf(ctx, r.StoreKey(), func(cur PodRecord) bool { return cur.Created.Before(since) })
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if detached {
			gone = append(gone, r.ID)
		}
	}
	return gone, errors.Join(errs...)
}

// prunable reports whether images with these digests may have become
// unused: some digest is not the image of a network that is configured
// and started (those hold their images, so a prune would remove nothing
// of theirs). A detach of pods on configured networks, the common case,
// then costs no listing of every record.
func (m *Manager) prunable(digests []string) bool {
	if len(digests) == 0 || m.images == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	held := map[string]bool{}
	for _, s := range m.active {
		held[s.img.Digest] = true
	}
	for _, d := range digests {
		if !held[d] {
			return true
		}
	}
	return false
}

// prune removes cached images no record and no configured network holds.
func (m *Manager) prune(ctx context.Context) {
	if m.images == nil {
		return
	}
	m.pruneMu.Lock()
	defer m.pruneMu.Unlock()
	all, err := m.st.ListMeta(ctx, MetaKind)
	if err != nil {
		m.log.Warn("image prune skipped", "err", err)
		return
	}
	// A record that does not decode may name any image: prune nothing.
	var recs []PodRecord
	for key, b := range all {
		var r PodRecord
		if err := json.Unmarshal(b, &r); err != nil {
			m.log.Warn("image prune skipped: a pod record does not decode", "key", key, "err", err)
			return
		}
		recs = append(recs, r)
	}
	inUse := map[string]bool{}
	for _, r := range recs {
		for _, a := range r.Attachments {
			if a.Digest != "" {
				inUse[a.Digest] = true
			}
		}
	}
	removed, err := m.images.Prune(inUse)
	if err != nil {
		m.log.Warn("image prune", "err", err)
	}
	if len(removed) > 0 {
		m.log.Info("pruned unused plugin images", "digests", removed)
	}
}
