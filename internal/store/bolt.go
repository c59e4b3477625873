package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketPools       = []byte("pools")
	bucketBlocks      = []byte("blocks") // sub-bucket per pool: index (BE uint32) -> node
	bucketAttachments = []byte("attachments")
	bucketMeta        = []byte("meta") // sub-bucket per kind
)

// BoltOptions configures OpenBolt. The zero value is usable.
type BoltOptions struct {
	// Timeout bounds the wait for the file lock held by another process.
	// Zero means 5 seconds.
	Timeout time.Duration
	// AttachmentsOnly: pools and blocks live in another store (the
	// Kubernetes API); an attachment's pool is not looked for in this
	// file. False: an attachment must name a pool of this file.
	AttachmentsOnly bool
	// NoSync: commits are not synced to the disk (Tiered's volatile file:
	// they survive the process, not the machine).
	NoSync bool
}

// Bolt is the embedded store: one bbolt file, one host.
type Bolt struct {
	db         *bolt.DB
	path       string
	checkPools bool
	group      groupCommit // attachment and meta writes, the ones every ADD and DEL makes
	commits    atomic.Uint64
}

var _ Store = (*Bolt)(nil)

// OpenBolt opens (creating if needed) the database at path.
func OpenBolt(path string, o BoltOptions) (*Bolt, error) {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.Timeout, NoSync: o.NoSync})
	if err != nil {
		return nil, fmt.Errorf("open store %q: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPools, bucketBlocks, bucketAttachments, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialise store %q: %w", path, err)
	}
	s := &Bolt{db: db, path: path, checkPools: !o.AttachmentsOnly}
	s.group = groupCommit{db: db, commits: &s.commits}
	return s, nil
}

// Commits is how many write transactions this store committed since it
// was opened (each one durable: bbolt syncs the file at every commit).
func (s *Bolt) Commits() uint64 { return s.commits.Load() }

func (s *Bolt) Describe() string { return "bolt:" + s.path }
func (s *Bolt) Close() error     { return s.db.Close() }

func attachmentKey(k AttachmentKey) []byte {
	return []byte(k.Network + "\x00" + k.ContainerID + "\x00" + k.IfName)
}

func blockKey(i uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], i)
	return b[:]
}

func (s *Bolt) CreatePool(ctx context.Context, p Pool, check func([]Pool) error) error {
	v, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return update(s.db, &s.commits, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPools)
		if b.Get([]byte(p.Name)) != nil {
			return fmt.Errorf("pool %q: %w", p.Name, ErrExists)
		}
		if check != nil {
			pools, err := listPools(tx)
			if err != nil {
				return err
			}
			if err := check(pools); err != nil {
				return err
			}
		}
		return b.Put([]byte(p.Name), v)
	})
}

func listPools(tx *bolt.Tx) ([]Pool, error) {
	var out []Pool
	err := tx.Bucket(bucketPools).ForEach(func(k, v []byte) error {
		var p Pool
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("decode pool %q: %w", k, err)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

func (s *Bolt) GetPool(ctx context.Context, name string) (Pool, error) {
	var p Pool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketPools).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("pool %q: %w", name, ErrNotFound)
		}
		return json.Unmarshal(v, &p)
	})
	return p, err
}

func (s *Bolt) ListPools(ctx context.Context) ([]Pool, error) {
	var out []Pool
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		out, err = listPools(tx)
		return err
	})
	return out, err
}

func (s *Bolt) DeletePool(ctx context.Context, name string, check func([]Attachment) error) error {
	return update(s.db, &s.commits, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPools)
		if b.Get([]byte(name)) == nil {
			return fmt.Errorf("pool %q: %w", name, ErrNotFound)
		}
		if check != nil {
			var holders []Attachment
			err := tx.Bucket(bucketAttachments).ForEach(func(k, v []byte) error {
				var a Attachment
				if err := json.Unmarshal(v, &a); err != nil {
					return err
				}
				if a.Pool == name {
					holders = append(holders, a)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if err := check(holders); err != nil {
				return err
			}
		}
		if bb := tx.Bucket(bucketBlocks); bb.Bucket([]byte(name)) != nil {
			if err := bb.DeleteBucket([]byte(name)); err != nil {
				return err
			}
		}
		return b.Delete([]byte(name))
	})
}

func (s *Bolt) ListBlocks(ctx context.Context, pool string) ([]Block, error) {
	var out []Block
	err := s.db.View(func(tx *bolt.Tx) error {
		bb := tx.Bucket(bucketBlocks)
		return bb.ForEach(func(name, _ []byte) error {
			if pool != "" && string(name) != pool {
				return nil
			}
			sub := bb.Bucket(name)
			if sub == nil {
				return nil
			}
			return sub.ForEach(func(k, v []byte) error {
				out = append(out, Block{Pool: string(name), Index: binary.BigEndian.Uint32(k), Node: string(v)})
				return nil
			})
		})
	})
	return out, err
}

func (s *Bolt) ClaimBlock(ctx context.Context, pool, node string, limit uint32, want *uint32, ok func(uint32) bool) (Block, error) {
	var got Block
	err := update(s.db, &s.commits, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketPools).Get([]byte(pool)) == nil {
			return fmt.Errorf("pool %q: %w", pool, ErrNotFound)
		}
		sub, err := tx.Bucket(bucketBlocks).CreateBucketIfNotExists([]byte(pool))
		if err != nil {
			return err
		}
		if want != nil {
			if *want >= limit {
				return fmt.Errorf("block %d of pool %q: %w", *want, pool, ErrNotFound)
			}
			if owner := sub.Get(blockKey(*want)); owner != nil {
				got = Block{Pool: pool, Index: *want, Node: string(owner)}
				if string(owner) == node {
					return nil
				}
				return fmt.Errorf("block %d of pool %q is owned by node %q: %w", *want, pool, owner, ErrConflict)
			}
			got = Block{Pool: pool, Index: *want, Node: node}
			return sub.Put(blockKey(*want), []byte(node))
		}
		// Walk the sorted keys alongside the candidate index: the first
		// gap accepted by ok is the lowest free block.
		c := sub.Cursor()
		k, _ := c.First()
		for i := uint32(0); i < limit; i++ {
			for k != nil && binary.BigEndian.Uint32(k) < i {
				k, _ = c.Next()
			}
			if k != nil && binary.BigEndian.Uint32(k) == i {
				continue
			}
			if ok != nil && !ok(i) {
				continue
			}
			got = Block{Pool: pool, Index: i, Node: node}
			return sub.Put(blockKey(i), []byte(node))
		}
		return fmt.Errorf("pool %q: %w", pool, ErrExhausted)
	})
	return got, err
}

func (s *Bolt) ReleaseBlock(ctx context.Context, pool string, index uint32, node string) error {
	return update(s.db, &s.commits, func(tx *bolt.Tx) error {
		sub := tx.Bucket(bucketBlocks).Bucket([]byte(pool))
		if sub == nil {
			return nil
		}
		owner := sub.Get(blockKey(index))
		if owner == nil {
			return nil
		}
		if string(owner) != node {
			return fmt.Errorf("block %d of pool %q is owned by node %q: %w", index, pool, owner, ErrConflict)
		}
		return sub.Delete(blockKey(index))
	})
}

// Attachment writes go through a group commit (group.go), not bbolt's
// Batch: Batch holds every call back up to MaxBatchDelay (10 ms) to gather
// company, which at low concurrency costs an ADD far more than the fsync
// (~0.1 ms) it saves; the group commit commits a lone write at once and
// gathers only the writes that arrive while another commit is under way.

func (s *Bolt) PutAttachment(ctx context.Context, a Attachment) error {
	v, err := json.Marshal(a)
	if err != nil {
		return err
	}
	key := attachmentKey(a.AttachmentKey)
	return s.group.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAttachments)
		if b.Get(key) != nil {
			return fmt.Errorf("attachment %s: %w", a.AttachmentKey, ErrExists)
		}
		// A pool deleted between allocation and this write must not
		// gain a holder it will never see.
		if s.checkPools && a.Pool != "" && tx.Bucket(bucketPools).Get([]byte(a.Pool)) == nil {
			return fmt.Errorf("pool %q of attachment %s: %w", a.Pool, a.AttachmentKey, ErrNotFound)
		}
		return b.Put(key, v)
	})
}

func (s *Bolt) UpdateAttachment(ctx context.Context, a Attachment) error {
	v, err := json.Marshal(a)
	if err != nil {
		return err
	}
	key := attachmentKey(a.AttachmentKey)
	return s.group.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAttachments)
		if b.Get(key) == nil {
			return fmt.Errorf("attachment %s: %w", a.AttachmentKey, ErrNotFound)
		}
		return b.Put(key, v)
	})
}

func (s *Bolt) GetAttachment(ctx context.Context, k AttachmentKey) (Attachment, error) {
	var a Attachment
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketAttachments).Get(attachmentKey(k))
		if v == nil {
			return fmt.Errorf("attachment %s: %w", k, ErrNotFound)
		}
		return json.Unmarshal(v, &a)
	})
	return a, err
}

func (s *Bolt) DeleteAttachment(ctx context.Context, k AttachmentKey) error {
	key := attachmentKey(k)
	return s.group.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAttachments).Delete(key)
	})
}

func (s *Bolt) ListAttachments(ctx context.Context) ([]Attachment, error) {
	var out []Attachment
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAttachments).ForEach(func(k, v []byte) error {
			var a Attachment
			if err := json.Unmarshal(v, &a); err != nil {
				return fmt.Errorf("decode attachment %q: %w", k, err)
			}
			out = append(out, a)
			return nil
		})
	})
	return out, err
}

// PutMeta writes (nil: deletes) one entry of kind. Concurrent writes share
// commits, as attachment writes do: pod networks write a durable record
// before each attach's plugins run, and eight attaches at once would
// otherwise queue for eight commits of two fsyncs each.
func (s *Bolt) PutMeta(ctx context.Context, kind, key string, value []byte) error {
	return s.group.update(func(tx *bolt.Tx) error {
		sub, err := tx.Bucket(bucketMeta).CreateBucketIfNotExists([]byte(kind))
		if err != nil {
			return err
		}
		if value == nil {
			return sub.Delete([]byte(key))
		}
		return sub.Put([]byte(key), value)
	})
}

func (s *Bolt) GetMeta(ctx context.Context, kind, key string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		sub := tx.Bucket(bucketMeta).Bucket([]byte(kind))
		if sub == nil {
			return fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
		}
		v := sub.Get([]byte(key))
		if v == nil {
			return fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

func (s *Bolt) ListMeta(ctx context.Context, kind string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		sub := tx.Bucket(bucketMeta).Bucket([]byte(kind))
		if sub == nil {
			return nil
		}
		return sub.ForEach(func(k, v []byte) error {
			out[string(k)] = bytes.Clone(v)
			return nil
		})
	})
	return out, err
}

// SortAttachments orders attachments by key, for stable listings.
func SortAttachments(as []Attachment) {
	sort.Slice(as, func(i, j int) bool { return as[i].AttachmentKey.String() < as[j].AttachmentKey.String() })
}
