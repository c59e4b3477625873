package cnirun

import (
	"errors"
	"io"
)

// The exchange on skeind's socket (skeind tells it from gRPC and from the
// older short path of package cniwire by its first bytes):
//
// Request: RequestMagic | u32 timeout in milliseconds (0: none)
//
//	| u64 dev | u64 inode of the binary's network namespace
//	| u64 dev | u64 inode of CNI_NETNS as the binary sees it (0 0: none)
//	| u16 length | service ("skein.v1.CNI")
//	| u16 count | count × (u16 length | "NAME=value") the CNI_ variables
//	| u32 length | stdin
//
// Reply:   ReplyMagic | u8 exit status | u32 length | stdout
//
// Integers are big-endian. The connection carries one call, then closes.
const (
	RequestMagic = "SKEIN-RUN/1\n"
	ReplyMagic   = "SKEIN-OUT/1\n"

	MaxService = 256
	MaxEnv     = 32
	MaxEnvVar  = 64 << 10
	// maxEnvFrame is what a variable's u16 length can say: the binary
	// refuses a longer one rather than frame it wrong.
	maxEnvFrame = 1<<16 - 1
	MaxStdin    = 4 << 20
	MaxStdout   = 16 << 20
)

// NSID names a network namespace: the device and inode of its nsfs file.
type NSID struct{ Dev, Ino uint64 }

// Request is one exec of a plugin binary.
type Request struct {
	TimeoutMS uint32
	// SelfNS is the binary's own network namespace (the runtime's), PodNS
	// the one CNI_NETNS names, both as the binary stat'ed them (zero when
	// it could not).
	SelfNS, PodNS NSID
	Service       string
	Env           []string // "CNI_COMMAND=ADD", …
	Stdin         []byte
}

// Reply is what the binary exits with and prints.
type Reply struct {
	Exit   uint8
	Stdout []byte
}

// Getenv looks a variable up in r.Env.
func (r *Request) Getenv(name string) string {
	for _, kv := range r.Env {
		if len(kv) > len(name) && kv[len(name)] == '=' && kv[:len(name)] == name {
			return kv[len(name)+1:]
		}
	}
	return ""
}

// AppendRequest appends r's frame to b.
func AppendRequest(b []byte, r Request) []byte {
	b = append(b, RequestMagic...)
	b = be32(b, r.TimeoutMS)
	for _, v := range []uint64{r.SelfNS.Dev, r.SelfNS.Ino, r.PodNS.Dev, r.PodNS.Ino} {
		b = be32(be32(b, uint32(v>>32)), uint32(v))
	}
	b = be16(b, uint16(len(r.Service)))
	b = append(b, r.Service...)
	b = be16(b, uint16(len(r.Env)))
	for _, kv := range r.Env {
		b = be16(b, uint16(len(kv)))
		b = append(b, kv...)
	}
	b = be32(b, uint32(len(r.Stdin)))
	return append(b, r.Stdin...)
}

// ErrFrame is a request or reply that breaks the format or its limits.
var ErrFrame = errors.New("malformed skein-run frame")

// ReadRequest reads a request whose magic was read already.
func ReadRequest(rd io.Reader) (Request, error) {
	var r Request
	var h [36]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return r, err
	}
	r.TimeoutMS = get32(h[:])
	var ids [4]uint64
	for i := range ids {
		ids[i] = uint64(get32(h[4+8*i:]))<<32 | uint64(get32(h[8+8*i:]))
	}
	r.SelfNS, r.PodNS = NSID{ids[0], ids[1]}, NSID{ids[2], ids[3]}
	svc, err := readBytes(rd, 2, MaxService)
	if err != nil {
		return r, err
	}
	r.Service = string(svc)
	n, err := readLen(rd, 2, MaxEnv)
	if err != nil {
		return r, err
	}
	for range n {
		kv, err := readBytes(rd, 2, MaxEnvVar)
		if err != nil {
			return r, err
		}
		r.Env = append(r.Env, string(kv))
	}
	r.Stdin, err = readBytes(rd, 4, MaxStdin)
	return r, err
}

// AppendReply appends r's frame to b.
func AppendReply(b []byte, r Reply) []byte {
	b = append(b, ReplyMagic...)
	b = append(b, r.Exit)
	b = be32(b, uint32(len(r.Stdout)))
	return append(b, r.Stdout...)
}

// ParseReply reads a whole reply; ErrFrame when it is not one.
func ParseReply(b []byte) (Reply, error) {
	var r Reply
	if len(b) < len(ReplyMagic)+5 || string(b[:len(ReplyMagic)]) != ReplyMagic {
		return r, ErrFrame
	}
	b = b[len(ReplyMagic):]
	r.Exit = b[0]
	if n := get32(b[1:]); uint64(n) != uint64(len(b)-5) {
		return r, ErrFrame
	}
	r.Stdout = b[5:]
	return r, nil
}

func be16(b []byte, v uint16) []byte { return append(b, byte(v>>8), byte(v)) }
func be32(b []byte, v uint32) []byte {
	return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}
func get32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// readLen reads a size-byte length and checks it against limit.
func readLen(rd io.Reader, size, limit int) (int, error) {
	var h [4]byte
	if _, err := io.ReadFull(rd, h[4-size:]); err != nil {
		return 0, err
	}
	n := int(get32(h[:]))
	if n > limit {
		return 0, ErrFrame
	}
	return n, nil
}

func readBytes(rd io.Reader, size, limit int) ([]byte, error) {
	n, err := readLen(rd, size, limit)
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	_, err = io.ReadFull(rd, b)
	return b, err
}
