package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Tiered keeps the attachments that cannot outlive a boot — those whose
// every trace is in network namespaces a reboot removes — in a second
// Bolt file whose commits are not synced (Volatile), and everything else
// in Durable. A commit to the volatile file is a write to the page cache:
// it survives skeind's crash (the kernel keeps the pages), not a power
// loss or a reboot, and after a reboot there is nothing left for those
// records to describe. An ADD pays ~20 µs for its record there instead of
// two fdatasyncs (~0.35 ms of a core here, docs/architecture.md).
//
// Records stay in the tier they were written to. A record's key is in at
// most one tier: callers serialise writes to one key (skeind locks each
// key for its ADD and DEL).
type Tiered struct {
	Store // Durable: pools, blocks, meta, and the attachments that are not volatile

	vol        *Bolt
	volatile   func(Attachment) bool
	checkPools bool
	// mu makes a pool's deletion and a volatile record's write to it
	// exclusive, as one transaction does in a single file.
	mu sync.RWMutex
}

// TieredOptions configures OpenTiered.
type TieredOptions struct {
	// Path of the volatile file; best on a tmpfs (/run).
	Path string
	// Volatile picks the attachments that go to the volatile file.
	Volatile func(Attachment) bool
	// CheckPools: Durable holds the pools, and a volatile record must name
	// one of them (false when pools live elsewhere, as in Kubernetes mode).
	CheckPools bool
	// Force opens a fresh volatile file even when this boot's was lost
	// (see ErrVolatileLost).
	Force bool
	// BootID is the kernel's boot ID; "" reads
	// /proc/sys/kernel/random/boot_id.
	BootID string
}

// ErrVolatileLost: the volatile file of this boot is gone or unreadable
// while the pods whose records it held may still run; starting with an
// empty one would take their links for leftovers.
var ErrVolatileLost = errors.New("this boot's volatile attachment records are lost")

// volatileMeta is where Durable notes the volatile file and its boot, and
// where the volatile file notes its own boot.
const (
	metaKind    = "store"
	metaVolKey  = "volatile"
	metaBootKey = "boot"
)

type volatileNote struct {
	Path string `json:"path"`
	Boot string `json:"boot"`
}

// OpenTiered opens (creating if needed) the volatile file beside durable,
// which the Tiered store closes with itself. A file from an earlier boot
// is discarded: its pods are gone. A file missing or unreadable although
// Durable notes that this boot made it is ErrVolatileLost unless Force.
func OpenTiered(ctx context.Context, durable Store, o TieredOptions) (*Tiered, error) {
	boot := o.BootID
	if boot == "" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return nil, fmt.Errorf("boot id: %w", err)
		}
		boot = strings.TrimSpace(string(b))
	}
	var note volatileNote
	if b, err := durable.GetMeta(ctx, metaKind, metaVolKey); err == nil {
		_ = json.Unmarshal(b, &note)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	ours := note == volatileNote{Path: o.Path, Boot: boot} // this boot made the file
	if note.Boot == boot && note.Path != o.Path && !o.Force {
		return nil, fmt.Errorf("%w: this boot's are in %s, not %s (was --socket or --volatile-store changed?). "+
			"Start with --volatile-store %s, or with --reconcile-force to begin with no records and delete the links they describe",
			ErrVolatileLost, note.Path, o.Path, note.Path)
	}
	lost := func(why string) error {
		return fmt.Errorf("%w: %s %s, though this boot's pods may still use them; skeind would take their links for leftovers. "+
			"Find out why (was the directory cleared, or not mounted from the host?), or start with --reconcile-force to begin with no records and delete those links",
			ErrVolatileLost, o.Path, why)
	}
	vol, err := openVolatile(o.Path, boot)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && ours && !o.Force:
		return nil, lost("is gone")
	case errors.Is(err, os.ErrNotExist):
		vol, err = createVolatile(ctx, o.Path, boot)
	case ours && !o.Force:
		return nil, lost(fmt.Sprintf("cannot be read (%v)", err))
	default: // an earlier boot's, or unreadable and not ours
		if rerr := os.Remove(o.Path); rerr != nil {
			return nil, fmt.Errorf("discard %s: %w (%v)", o.Path, rerr, err)
		}
		vol, err = createVolatile(ctx, o.Path, boot)
	}
	if err != nil {
		return nil, err
	}
	if !ours {
		b, _ := json.Marshal(volatileNote{Path: o.Path, Boot: boot})
		if err := durable.PutMeta(ctx, metaKind, metaVolKey, b); err != nil {
			vol.Close()
			return nil, err
		}
	}
	return &Tiered{Store: durable, vol: vol, volatile: o.Volatile, checkPools: o.CheckPools}, nil
}

// errEarlierBoot: the volatile file is from an earlier boot.
var errEarlierBoot = errors.New("made by an earlier boot")

func openVolatile(path, boot string) (*Bolt, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	vol, err := OpenBolt(path, BoltOptions{AttachmentsOnly: true, NoSync: true})
	if err != nil {
		return nil, err
	}
	if b, err := vol.GetMeta(context.Background(), metaKind, metaBootKey); err != nil || string(b) != boot {
		vol.Close()
		return nil, fmt.Errorf("%s: %w", path, errEarlierBoot)
	}
	return vol, nil
}

func createVolatile(ctx context.Context, path, boot string) (*Bolt, error) {
	vol, err := OpenBolt(path, BoltOptions{AttachmentsOnly: true, NoSync: true})
	if err != nil {
		return nil, err
	}
	if err := vol.PutMeta(ctx, metaKind, metaBootKey, []byte(boot)); err != nil {
		vol.Close()
		return nil, err
	}
	return vol, nil
}

func (t *Tiered) PutAttachment(ctx context.Context, a Attachment) error {
	if !t.volatile(a) {
		return t.Store.PutAttachment(ctx, a)
	}
	if _, err := t.Store.GetAttachment(ctx, a.AttachmentKey); err == nil {
		return fmt.Errorf("attachment %s: %w", a.AttachmentKey, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.checkPools && a.Pool != "" {
		if _, err := t.Store.GetPool(ctx, a.Pool); errors.Is(err, ErrNotFound) {
			return fmt.Errorf("pool %q of attachment %s: %w", a.Pool, a.AttachmentKey, ErrNotFound)
		} else if err != nil {
			return err
		}
	}
	return t.vol.PutAttachment(ctx, a)
}

// tierOf is the store holding k's record (nil: none does).
func (t *Tiered) tierOf(ctx context.Context, k AttachmentKey) (Store, Attachment, error) {
	for _, s := range []Store{t.vol, t.Store} {
		a, err := s.GetAttachment(ctx, k)
		if err == nil {
			return s, a, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, a, err
		}
	}
	return nil, Attachment{}, fmt.Errorf("attachment %s: %w", k, ErrNotFound)
}

func (t *Tiered) GetAttachment(ctx context.Context, k AttachmentKey) (Attachment, error) {
	_, a, err := t.tierOf(ctx, k)
	return a, err
}

func (t *Tiered) UpdateAttachment(ctx context.Context, a Attachment) error {
	s, _, err := t.tierOf(ctx, a.AttachmentKey)
	if err != nil {
		return err
	}
	return s.UpdateAttachment(ctx, a)
}

// DeleteAttachment deletes k's record where it is: a key in neither tier
// costs no commit.
func (t *Tiered) DeleteAttachment(ctx context.Context, k AttachmentKey) error {
	s, _, err := t.tierOf(ctx, k)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.DeleteAttachment(ctx, k)
}

func (t *Tiered) ListAttachments(ctx context.Context) ([]Attachment, error) {
	vol, err := t.vol.ListAttachments(ctx)
	if err != nil {
		return nil, err
	}
	rest, err := t.Store.ListAttachments(ctx)
	return append(vol, rest...), err
}

// DeletePool checks the holders in both tiers.
func (t *Tiered) DeletePool(ctx context.Context, name string, check func([]Attachment) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Store.DeletePool(ctx, name, func(holders []Attachment) error {
		vol, err := t.vol.ListAttachments(ctx)
		if err != nil {
			return err
		}
		for _, a := range vol {
			if a.Pool == name {
				holders = append(holders, a)
			}
		}
		if check == nil {
			return nil
		}
		return check(holders)
	})
}

// Volatile is the unsynced file, for other records that need only
// survive skeind, not the machine (package kurma's completed adds).
func (t *Tiered) Volatile() Store { return t.vol }

func (t *Tiered) Describe() string {
	return t.Store.Describe() + ", volatile attachments " + t.vol.Describe()
}

// Commits counts the durable tier's commits, the synced ones (a volatile
// commit costs a write to the page cache).
func (t *Tiered) Commits() uint64 {
	if c, ok := t.Store.(interface{ Commits() uint64 }); ok {
		return c.Commits()
	}
	return 0
}

func (t *Tiered) Close() error {
	return errors.Join(t.vol.Close(), t.Store.Close())
}
