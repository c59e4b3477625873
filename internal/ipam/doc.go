// Package ipam hands out addresses. A pool's subnets are carved into
// blocks of 2^blockSizeBits addresses; a node claims whole blocks from the
// store and hands out addresses from per-block bitmaps in memory, rebuilt
// from the store's attachments on start.
//
// The geometry and bitmap code is pure (no store, no sockets) and table
// tested; Manager adds the store and the locking.
package ipam
