package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// MetaKind is the store bucket of pod records (store.Store's Meta).
const MetaKind = "kurma-pods"

// States of an attachment record.
const (
	// StateAdding: written before the add runs (the intent); a record
	// left in it after a crash is rolled back (del) by Recover.
	StateAdding = "adding"
	// StateAttached: the add succeeded; Result holds what it returned.
	StateAttached = "attached"
	// StateDelFailed: a del (detach or rollback) failed; Detach and GC
	// retry it.
	StateDelFailed = "del-failed"
)

// PodRecord is what skeind keeps of one pod's networks, in attach order.
type PodRecord struct {
	ID          string             `json:"id"`
	NetNS       string             `json:"netns"`
	Owner       string             `json:"owner,omitempty"` // AttachRequest.Owner of the first attach
	Attachments []AttachmentRecord `json:"attachments"`
	Created     time.Time          `json:"created"`
}

// AttachmentRecord is one network of a pod: everything a del needs, even
// after a restart and after the network left the config.
type AttachmentRecord struct {
	Network string `json:"network"`
	IfName  string `json:"ifName,omitempty"`
	// Config is the network's entry as it was given to add (del gets the
	// same bytes).
	Config json.RawMessage `json:"config"`
	// Image and Digest name the plugin image ("" for a built-in network).
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Insecure is the network's "insecure" at add time (kept for the
	// record; a del never fetches).
	Insecure bool          `json:"insecure,omitempty"`
	Pool     string        `json:"pool,omitempty"`
	Timeout  time.Duration `json:"timeout"`
	State    string        `json:"state"`
	// Result is the 1.1.0 result of the add (StateAttached).
	Result json.RawMessage `json:"result,omitempty"`
	// Error is the last del failure (StateDelFailed).
	Error   string    `json:"error,omitempty"`
	Created time.Time `json:"created"`
}

// Builtin reports whether skeind itself served the attachment.
func (a *AttachmentRecord) Builtin() bool { return a.Digest == "" }

func (m *Manager) getRecord(ctx context.Context, id string) (PodRecord, bool, error) {
	b, err := m.st.GetMeta(ctx, MetaKind, id)
	if errors.Is(err, store.ErrNotFound) {
		return PodRecord{}, false, nil
	}
	if err != nil {
		return PodRecord{}, false, fmt.Errorf("read record of pod %s: %w", id, err)
	}
	var r PodRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return PodRecord{}, false, fmt.Errorf("decode record of pod %s: %w", id, err)
	}
	return r, true, nil
}

// putRecord writes r, or deletes it when it has no attachments left.
func (m *Manager) putRecord(ctx context.Context, r PodRecord) error {
	var b []byte
	if len(r.Attachments) > 0 {
		var err error
		if b, err = json.Marshal(r); err != nil {
			return fmt.Errorf("encode record of pod %s: %w", r.ID, err)
		}
	}
	if err := m.st.PutMeta(ctx, MetaKind, r.ID, b); err != nil {
		return fmt.Errorf("write record of pod %s: %w", r.ID, err)
	}
	return nil
}

func (m *Manager) listRecords(ctx context.Context) ([]PodRecord, error) {
	all, err := m.st.ListMeta(ctx, MetaKind)
	if err != nil {
		return nil, fmt.Errorf("list pod records: %w", err)
	}
	out := make([]PodRecord, 0, len(all))
	for id, b := range all {
		var r PodRecord
		if err := json.Unmarshal(b, &r); err != nil {
			m.log.Error("undecodable pod record skipped", "pod", id, "err", err)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}
