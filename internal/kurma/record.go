package kurma

import (
	"context"
	"crypto/rand"
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
	// Seal names the durable write of the record: new at each write when
	// the store has a volatile tier (putRecord).
	Seal string `json:"seal,omitempty"`
	// Over is, in a completion (putCompletion), the Seal of the durable
	// record it completes; it counts only while that record is unchanged.
	Over string `json:"over,omitempty"`
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

// Records are durable (the store's synced file), except for the
// completion of an add: the record with the add's result, written once the
// plugin succeeded, goes to the store's volatile tier when it has one
// (store.Tiered), which survives skeind, not the machine, and costs no
// sync. It names the Seal of the durable record it completes (the
// intent), and the two merge as long as that record is unchanged; every
// durable write gets a new Seal, so an older completion never overrides a
// newer durable write. After a crash of skeind the completion is still
// there; after a reboot only the intent is, and Recover then deletes an
// add whose pod went with the machine. The next durable write of the
// record (another network, a detach) carries the completed add with it.

// getRecord reads the record stored under key: the durable record, or its
// completion. The completion is read first: a write between the two reads
// (readers need not hold the pod's lock) then shows as a seal that does
// not match, and the durable record read second already carries what the
// completion said (putRecord writes the durable record before it drops
// the completion).
func (m *Manager) getRecord(ctx context.Context, key string) (PodRecord, bool, error) {
	var c PodRecord
	var has bool
	if m.vol != nil {
		var err error
		if c, has, err = readRecord(ctx, m.vol, key); err != nil {
			return PodRecord{}, false, fmt.Errorf("completion of %w", err)
		}
	}
	r, found, err := readRecord(ctx, m.st, key)
	if err != nil || !found {
		return r, found, err
	}
	if has && r.Seal != "" && c.Over == r.Seal {
		c.Seal, c.Over = r.Seal, ""
		return c, true, nil
	}
	return r, true, nil
}

func readRecord(ctx context.Context, st store.Store, key string) (PodRecord, bool, error) {
	b, err := st.GetMeta(ctx, MetaKind, key)
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

// putRecord writes r durably, or deletes it when it has no attachments
// left, with a new Seal (set in r), and drops its completion.
func (m *Manager) putRecord(ctx context.Context, r *PodRecord) error {
	var b []byte
	// Without a volatile tier no seal: one carried over from a record
	// read before would let a completion left from such a start count
	// again.
	r.Over, r.Seal = "", ""
	if len(r.Attachments) > 0 {
		if m.vol != nil {
			r.Seal = rand.Text()
		}
		var err error
		if b, err = json.Marshal(r); err != nil {
			return fmt.Errorf("encode pod record %s: %w", r.StoreKey(), err)
		}
	}
	if err := m.st.PutMeta(ctx, MetaKind, r.StoreKey(), b); err != nil {
		return fmt.Errorf("write pod record %s: %w", r.StoreKey(), err)
	}
	if m.vol != nil {
		// A completion left behind (a crash before this) no longer
		// counts: its Over is not the new Seal.
		if _, err := m.vol.GetMeta(ctx, MetaKind, r.StoreKey()); err == nil {
			if err := m.vol.PutMeta(ctx, MetaKind, r.StoreKey(), nil); err != nil {
				m.log.Warn("drop a pod record's completion", "key", r.StoreKey(), "err", err)
			}
		}
	}
	return nil
}

// putCompletion writes r, the completion of the durable record sealed
// r.Seal, to the volatile tier (durably when there is none).
func (m *Manager) putCompletion(ctx context.Context, r *PodRecord) error {
	if m.vol == nil || r.Seal == "" || len(r.Attachments) == 0 {
		return m.putRecord(ctx, r)
	}
	c := *r
	c.Seal, c.Over = "", r.Seal
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode pod record %s: %w", r.StoreKey(), err)
	}
	if err := m.vol.PutMeta(ctx, MetaKind, r.StoreKey(), b); err != nil {
		return fmt.Errorf("write pod record %s: %w", r.StoreKey(), err)
	}
	return nil
}

// listRecords returns every record, each merged with its completion (the
// completions listed first, as getRecord reads them). Undecodable records
// are logged and skipped.
func (m *Manager) listRecords(ctx context.Context) ([]PodRecord, error) {
	var done map[string][]byte
	if m.vol != nil {
		var err error
		if done, err = m.vol.ListMeta(ctx, MetaKind); err != nil {
			return nil, fmt.Errorf("list pod records' completions: %w", err)
		}
	}
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
		var c PodRecord
		if cb, ok := done[key]; ok && r.Seal != "" && json.Unmarshal(cb, &c) == nil && c.Over == r.Seal {
			c.Seal, c.Over = r.Seal, ""
			r = c
		}
		out = append(out, r)
	}
	return out, nil
}

// sweepCompletions deletes the completions whose durable record changed
// or went (a crash between the two writes of putRecord, or a record
// removed by hand), each under its pod's lock and checked again there.
func (m *Manager) sweepCompletions(ctx context.Context) error {
	if m.vol == nil {
		return nil
	}
	done, err := m.vol.ListMeta(ctx, MetaKind)
	if err != nil {
		return err
	}
	for key := range done {
		unlock := m.locks.Lock(podOfKey(key))
		err := m.sweepOne(ctx, key)
		unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// sweepOne deletes key's completion unless it completes key's durable
// record. The pod's lock is held.
func (m *Manager) sweepOne(ctx context.Context, key string) error {
	c, has, err := readRecord(ctx, m.vol, key)
	if err == nil && !has {
		return nil
	}
	// A completion that does not decode completes nothing.
	r, found, rerr := readRecord(ctx, m.st, key)
	if err == nil && rerr == nil && found && r.Seal != "" && c.Over == r.Seal {
		return nil
	}
	return m.vol.PutMeta(ctx, MetaKind, key, nil)
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
