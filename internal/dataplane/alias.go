package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"
)

// MaxAliasLen is the longest interface alias the kernel accepts
// (IFALIASZ-1 bytes); a longer one fails the whole request.
const MaxAliasLen = 255

// AttachmentAlias returns the ownership tag of an attachment's host link:
// prefix, then "network:containerID:ifName". It always fits MaxAliasLen
// (given a prefix of at most 64 bytes, which Config allows, and an
// interface name of at most 15). When the fields are too long, the network
// and then the container ID are shortened: a shortened field keeps its
// beginning, then "~" and 8 hex digits of a hash of the whole field, so the
// tag still splits at its last two colons into the three fields, stays
// valid UTF-8, and two long IDs that share a beginning still differ.
func AttachmentAlias(prefix, network, containerID, ifName string) string {
	room := MaxAliasLen - len(prefix) - len(ifName) - 2
	if len(network)+len(containerID) > room {
		// The container ID keeps at least half of the room, the network
		// the rest; whichever needs less leaves its share to the other.
		keepCtr := max(room/2, room-len(network))
		network = shorten(network, room-min(len(containerID), keepCtr))
		containerID = shorten(containerID, room-len(network))
	}
	return prefix + network + ":" + containerID + ":" + ifName
}

// shorten returns s if it fits n bytes, otherwise its longest beginning
// that ends on a rune boundary followed by "~" and a hash of s, in n bytes.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	h := sha256.Sum256([]byte(s))
	tail := "~" + hex.EncodeToString(h[:4])
	keep := max(n-len(tail), 0)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + tail
}
