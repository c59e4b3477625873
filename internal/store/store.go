package store

import (
	"context"
	"errors"
	"net/netip"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	ErrNotFound  = errors.New("not found")
	ErrExists    = errors.New("already exists")
	ErrExhausted = errors.New("no free block")
	ErrConflict  = errors.New("conflict")
)

// Pool is a named set of subnets carved into blocks of 2^BlockSizeBits
// addresses per family.
type Pool struct {
	Name          string         `json:"name"`
	Subnets       []netip.Prefix `json:"subnets"`
	BlockSizeBits int            `json:"blockSizeBits"`
	// Reserved lists addresses, CIDRs or "first-last" ranges the pool never
	// hands out.
	Reserved []string  `json:"reserved,omitempty"`
	Created  time.Time `json:"created"`
	// UID tells one life of a pool from another under the same name (the
	// Kubernetes store: the AddressPool's UID); empty in the embedded store.
	UID string `json:"uid,omitempty"`
	// Deleting is set while the pool is being deleted (the Kubernetes
	// store: a deletion timestamp, blocks still held): no block of it may
	// be claimed.
	Deleting bool `json:"deleting,omitempty"`
	// MaxBlocksPerNode caps the blocks one node holds (the Kubernetes
	// store: AddressPool spec.maxBlocksPerNode); 0 = no cap.
	MaxBlocksPerNode int `json:"maxBlocksPerNode,omitempty"`
}

// Block is one slice of a pool, owned by one node. Index counts blocks
// across the pool's subnets (see ipam.Geometry).
type Block struct {
	Pool  string `json:"pool"`
	Index uint32 `json:"index"`
	Node  string `json:"node"`
}

// AttachmentKey identifies an attachment, as CNI does: network name,
// container ID and interface name inside the container.
type AttachmentKey struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (k AttachmentKey) String() string {
	return k.Network + "/" + k.ContainerID + "/" + k.IfName
}

// Attachment is one interface of one container, VM or Docker endpoint.
type Attachment struct {
	AttachmentKey
	Pool         string       `json:"pool"`
	Addrs        []netip.Addr `json:"addrs"`
	NetNS        string       `json:"netns,omitempty"`
	HostLink     string       `json:"hostLink,omitempty"`
	ContainerMAC string       `json:"containerMAC,omitempty"`
	// Owner names the front door that made it: cni, docker, vm, kurma.
	Owner string `json:"owner"`
	// Borrowed: the addresses belong to other records (Docker's IPAM
	// leases); this one only routes them to its link. One record owns an
	// address: only the owner holds it in the allocator, releases it, and
	// restores it on start.
	Borrowed bool      `json:"borrowed,omitempty"`
	Created  time.Time `json:"created"`
	// Extra is opaque data a front door keeps with the attachment (for
	// instance the CNI result it returned, to answer CHECK).
	Extra []byte `json:"extra,omitempty"`
}

// Store is what skeind needs from durable storage. Every method is safe for
// concurrent use. A cancelled context may abort a call that has not yet
// committed; a committed write is durable when the method returns.
type Store interface {
	// CreatePool stores a new pool. ErrExists if the name is taken.
	// Overlap with other pools is the caller's check (ipam), done under
	// the same serialisation as CreatePool in CreatePoolChecked.
	CreatePool(ctx context.Context, p Pool, check func(existing []Pool) error) error
	// GetPool returns ErrNotFound for an unknown name.
	GetPool(ctx context.Context, name string) (Pool, error)
	ListPools(ctx context.Context) ([]Pool, error)
	// DeletePool removes the pool and every block record of it, after
	// check (called inside the write transaction with the pool's
	// attachments) returns nil. ErrNotFound for an unknown name.
	DeletePool(ctx context.Context, name string, check func(holders []Attachment) error) error

	// ListBlocks lists the blocks of pool ("" = all pools).
	ListBlocks(ctx context.Context, pool string) ([]Block, error)
	// ClaimBlock atomically gives node a block of pool. want, if non-nil,
	// names the only acceptable index; ErrConflict if another node owns
	// it (the returned Block says which). Otherwise the lowest free index
	// accepted by ok (nil = any) below limit is taken; ErrExhausted if none.
	ClaimBlock(ctx context.Context, pool, node string, limit uint32, want *uint32, ok func(uint32) bool) (Block, error)
	// ReleaseBlock frees a block owned by node; nil if already free.
	ReleaseBlock(ctx context.Context, pool string, index uint32, node string) error

	// PutAttachment creates an attachment. ErrExists if the key is taken.
	PutAttachment(ctx context.Context, a Attachment) error
	// UpdateAttachment replaces an existing attachment. ErrNotFound if absent.
	UpdateAttachment(ctx context.Context, a Attachment) error
	// GetAttachment returns ErrNotFound when absent.
	GetAttachment(ctx context.Context, k AttachmentKey) (Attachment, error)
	// DeleteAttachment is idempotent: nil when already gone.
	DeleteAttachment(ctx context.Context, k AttachmentKey) error
	ListAttachments(ctx context.Context) ([]Attachment, error)

	// Meta stores small named documents (front doors' own records, such
	// as Docker networks and endpoints) in bucket kind under key. A nil
	// value deletes. GetMeta returns ErrNotFound when absent.
	PutMeta(ctx context.Context, kind, key string, value []byte) error
	GetMeta(ctx context.Context, kind, key string) ([]byte, error)
	ListMeta(ctx context.Context, kind string) (map[string][]byte, error)

	// Describe names the implementation and its location, for status.
	Describe() string
	Close() error
}
