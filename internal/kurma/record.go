package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
// A pod may have several records (see AttachRequest.Key), each under its
// own key.
type PodRecord struct {
	ID string `json:"id"`
	// Key is the record's key in the store: ID, or ID/… for one of several
	// records of the pod. Empty in records written before records had
	// keys: those are stored under ID.
	Key         string             `json:"key,omitempty"`
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

// StoreKey is the key the record is stored under.
func (r *PodRecord) StoreKey() string {
	if r.Key == "" {
		return r.ID
	}
	return r.Key
}

// Builtin reports whether skeind itself served the attachment.
func (a *AttachmentRecord) Builtin() bool { return a.Digest == "" }

// getRecord reads the record stored under key.
func (m *Manager) getRecord(ctx context.Context, key string) (PodRecord, bool, error) {
	b, err := m.st.GetMeta(ctx, MetaKind, key)
	if errors.Is(err, store.ErrNotFound) {
		return PodRecord{}, false, nil
	}
	if err != nil {
		return PodRecord{}, false, fmt.Errorf("read pod record %s: %w", key, err)
	}
	var r PodRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return PodRecord{}, false, fmt.Errorf("decode pod record %s: %w", key, err)
	}
	return r, true, nil
}

// putRecord writes r, or deletes it when it has no attachments left.
func (m *Manager) putRecord(ctx context.Context, r PodRecord) error {
	var b []byte
	if len(r.Attachments) > 0 {
		var err error
		if b, err = json.Marshal(r); err != nil {
			return fmt.Errorf("encode pod record %s: %w", r.StoreKey(), err)
		}
	}
	if err := m.st.PutMeta(ctx, MetaKind, r.StoreKey(), b); err != nil {
		return fmt.Errorf("write pod record %s: %w", r.StoreKey(), err)
	}
	return nil
}

func (m *Manager) listRecords(ctx context.Context) ([]PodRecord, error) {
	all, err := m.st.ListMeta(ctx, MetaKind)
	if err != nil {
		return nil, fmt.Errorf("list pod records: %w", err)
	}
	out := make([]PodRecord, 0, len(all))
	for key, b := range all {
		var r PodRecord
		if err := json.Unmarshal(b, &r); err != nil {
			m.log.Error("undecodable pod record skipped", "key", key, "err", err)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// maxKeyTail bounds what a record key may add to the pod's ID.
const maxKeyTail = 256

// podOfKey returns the pod a record key belongs to: the key up to its
// first '/' (pod IDs have none).
func podOfKey(key string) string {
	id, _, _ := strings.Cut(key, "/")
	return id
}

// checkKey validates a record key: a pod ID, or a pod ID, '/' and up to
// maxKeyTail bytes of printable UTF-8 without spaces.
func checkKey(key string) error {
	id, tail, has := strings.Cut(key, "/")
	if err := checkPod(id, ""); err != nil {
		return err
	}
	if !has {
		return nil
	}
	if tail == "" || len(tail) > maxKeyTail {
		return fmt.Errorf("%w: record key %q: want %s/ and 1-%d characters", ErrBadRequest, key, id, maxKeyTail)
	}
	for _, c := range tail {
		if c == utf8.RuneError || c == ' ' || !unicode.IsPrint(c) {
			return fmt.Errorf("%w: record key %q: want printable UTF-8 without spaces", ErrBadRequest, key)
		}
	}
	return nil
}
