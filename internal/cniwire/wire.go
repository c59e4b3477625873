// Package cniwire is the short path between the skein CNI binary and
// skeind: one request and one reply on a UNIX socket connection of their
// own, framed by a few fixed-size fields, with no handshake before the
// request. It carries the calls of skeind's gRPC services whose methods
// take a CNIRequest and answer a CNIReply (skein.v1.CNI, skein.v1.VM), the
// same protobuf messages, the same status codes.
//
// Why: a unary gRPC call on a fresh connection, as the binary makes on
// every exec, costs skeind grpc-go's per-connection set-up (its buffers,
// reader and writer goroutines, the HTTP/2 settings exchange, HPACK, a
// stream goroutine) and the binary its HTTP/2 client: about 0.4 ms for a
// call that does nothing, on the machines of docs/benchmarks. Here the
// binary writes its request in one write, skeind reads it, runs the method
// and writes the reply.
//
// The socket is shared with gRPC: skeind's listener (Split) reads the
// first bytes of each connection and hands every connection that does not
// start with RequestMagic to the gRPC server, bytes and all. A skeind that
// predates this path answers the magic as a bad HTTP/2 preface (its
// SETTINGS frame, then a closed connection, and nothing run), so the
// binary falls back to gRPC when the first bytes back are not AckMagic.
// skeind writes AckMagic as soon as it has read a whole request and
// before it runs it, so a connection lost after that never makes the
// binary send the request again.
//
// Request:  RequestMagic | u16 method length | method ("/service/Method")
//
//	| u32 timeout in milliseconds (0: none) | u32 body length | body
//
// Reply:    AckMagic | u32 status code (gRPC's: 0 OK) | u32 message length
//
//	| message | u32 body length | body
//
// Integers are big-endian. The connection carries one call, then closes.
package cniwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	// RequestMagic opens a request; it is as long as AckMagic and shorter
	// than HTTP/2's client preface, which starts otherwise.
	RequestMagic = "SKEIN-CNI/1\n"
	// AckMagic opens a reply: skeind read the request whole and runs it.
	AckMagic = "SKEIN-ACK/1\n"

	// MaxMethod, MaxBody and MaxMessage bound what each side reads: the
	// body as grpc-go's default receive limit, the reply's body as the
	// gRPC client's.
	MaxMethod   = 256
	MaxBody     = 4 << 20
	MaxReply    = 16 << 20
	MaxMessage  = 64 << 10
	magicLength = len(RequestMagic)
)

// CodeOK is gRPC's status code for success; a Reply carries gRPC's codes.
const CodeOK = 0

// ErrNotSkeinWire: the peer did not answer with AckMagic (a skeind
// without this path, or not skeind); nothing was run.
var ErrNotSkeinWire = errors.New("peer does not speak the skein CNI wire")

// Request is one call.
type Request struct {
	Method    string // "/skein.v1.CNI/Add"
	TimeoutMS uint32 // 0: none
	Body      []byte // a serialized CNIRequest
}

// Reply is skeind's answer.
type Reply struct {
	Code    uint32
	Message string
	Body    []byte // a serialized CNIReply when Code is 0
}

// AppendRequest appends r's frame to b.
func AppendRequest(b []byte, r Request) []byte {
	b = append(b, RequestMagic...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Method)))
	b = append(b, r.Method...)
	b = binary.BigEndian.AppendUint32(b, r.TimeoutMS)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Body)))
	return append(b, r.Body...)
}

// ReadRequest reads the rest of a request whose magic was read already.
func ReadRequest(rd io.Reader) (Request, error) {
	var r Request
	var n [2]byte
	if _, err := io.ReadFull(rd, n[:]); err != nil {
		return r, fmt.Errorf("request method length: %w", err)
	}
	ml := int(binary.BigEndian.Uint16(n[:]))
	if ml == 0 || ml > MaxMethod {
		return r, fmt.Errorf("request method of %d bytes (1 to %d)", ml, MaxMethod)
	}
	m := make([]byte, ml)
	if _, err := io.ReadFull(rd, m); err != nil {
		return r, fmt.Errorf("request method: %w", err)
	}
	r.Method = string(m)
	var tl [8]byte
	if _, err := io.ReadFull(rd, tl[:]); err != nil {
		return r, fmt.Errorf("request header: %w", err)
	}
	r.TimeoutMS = binary.BigEndian.Uint32(tl[:4])
	bl := binary.BigEndian.Uint32(tl[4:])
	if bl > MaxBody {
		return r, fmt.Errorf("request body of %d bytes (at most %d)", bl, MaxBody)
	}
	r.Body = make([]byte, bl)
	if _, err := io.ReadFull(rd, r.Body); err != nil {
		return r, fmt.Errorf("request body: %w", err)
	}
	return r, nil
}

// AppendReply appends r's frame, AckMagic excluded (it was sent first).
func AppendReply(b []byte, r Reply) []byte {
	msg := r.Message
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	b = binary.BigEndian.AppendUint32(b, r.Code)
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, msg...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Body)))
	return append(b, r.Body...)
}

// ReadAck reads the first bytes of an answer: nil when they are AckMagic,
// ErrNotSkeinWire when they are anything else or the connection ends
// first (nothing was run), another error when reading fails otherwise
// (a deadline: whether the request ran is unknown).
//
// A peer that sends a byte AckMagic does not start with is answered at
// once: an HTTP/2 server's SETTINGS frame starts with a zero byte.
func ReadAck(rd io.Reader) error {
	var m [magicLength]byte
	n := 0
	for n < magicLength {
		k, err := rd.Read(m[n:])
		n += k
		if !bytes.HasPrefix([]byte(AckMagic), m[:n]) {
			return fmt.Errorf("%w (got %q)", ErrNotSkeinWire, m[:n])
		}
		if err != nil && n < magicLength {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%w (got %q, then the end)", ErrNotSkeinWire, m[:n])
			}
			return err
		}
	}
	return nil
}

// ReadReply reads a reply after its AckMagic.
func ReadReply(rd io.Reader) (Reply, error) {
	var r Reply
	var h [8]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return r, fmt.Errorf("reply header: %w", err)
	}
	r.Code = binary.BigEndian.Uint32(h[:4])
	ml := binary.BigEndian.Uint32(h[4:])
	if ml > MaxMessage {
		return r, fmt.Errorf("reply message of %d bytes (at most %d)", ml, MaxMessage)
	}
	msg := make([]byte, ml)
	if _, err := io.ReadFull(rd, msg); err != nil {
		return r, fmt.Errorf("reply message: %w", err)
	}
	r.Message = string(msg)
	var bl [4]byte
	if _, err := io.ReadFull(rd, bl[:]); err != nil {
		return r, fmt.Errorf("reply body length: %w", err)
	}
	n := binary.BigEndian.Uint32(bl[:])
	if n > MaxReply {
		return r, fmt.Errorf("reply body of %d bytes (at most %d)", n, MaxReply)
	}
	r.Body = make([]byte, n)
	if _, err := io.ReadFull(rd, r.Body); err != nil {
		return r, fmt.Errorf("reply body: %w", err)
	}
	return r, nil
}

// isRequest reports whether the first bytes of a connection open a
// request.
func isRequest(first []byte) bool { return bytes.Equal(first, []byte(RequestMagic)) }
