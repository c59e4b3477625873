// Package rpcwire carries skeind's unary gRPC methods (Pods, Admin, CNI,
// VM) in plain frames on skeind's socket, beside gRPC itself: the same
// protobuf messages, status codes and deadlines, without HTTP/2.
//
// Why: a gRPC call is handed between goroutines on both sides (the
// caller, the client's writer loop, the transport's reader, the server's
// stream goroutine and its writer loop), and on a machine whose cores
// have gone idle each hand-over wakes one. A no-op call after 100 ms idle
// took 0.60 ms over gRPC and 0.18 ms as one frame each way, a call whose
// handler works for 11 ms 1.3 ms and 0.6 ms more than its handler
// (docs/benchmarks/kurma.md). Here a call is one write and one read on a
// kept connection, and skeind runs the method on the goroutine that read
// the frame.
//
// Conn implements grpc.ClientConnInterface, so the generated clients work
// on it unchanged:
//
//	conn := rpcwire.Dial("/run/skein/skeind.sock")
//	defer conn.Close()
//	pods := rpc.NewPodsClient(conn)
//
// The exchange, after the client's Magic (sent once, with its first
// request) and the server's (sent once, before its first reply):
//
//	request: u32 length of the rest | u32 timeout in ms (0: none)
//	         | u16 length | method ("/skein.v1.Pods/Attach") | message
//	reply:   u32 length of the rest | u32 length | status (a
//	         google.rpc.Status; empty when the call succeeded) | message
//
// Integers are big-endian, messages protobuf. A connection carries one
// call at a time, any number in turn. A client that gives up on a call
// closes the connection, and skeind cancels the call's context as gRPC
// would. Streams are not carried (skeind serves none).
package rpcwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Magic opens a connection in each direction. It is as long as the CNI
// binaries' own (internal/cnirun), which shares the socket.
const Magic = "SKEIN-RPC/1\n"

const (
	// MaxRequest bounds a request frame (gRPC's default limit for a
	// received message is 4 MiB).
	MaxRequest = 4<<20 + 1024
	// MaxReply bounds a reply frame.
	MaxReply = 64 << 20
	// maxMethod bounds a method name.
	maxMethod = 1024
)

// appendRequest appends a request frame for method with a marshalled
// message to b.
func appendRequest(b []byte, timeoutMS uint32, method string, msg []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+len(method)+len(msg)))
	b = binary.BigEndian.AppendUint32(b, timeoutMS)
	b = binary.BigEndian.AppendUint16(b, uint16(len(method)))
	b = append(b, method...)
	return append(b, msg...)
}

// request is a request frame read.
type request struct {
	timeoutMS uint32
	method    string
	msg       []byte
}

// readFrame reads one length-prefixed frame's body into buf, refusing
// bodies over limit. buf grows with the bytes that arrive, not with the
// length announced, so a peer that announces much and sends little holds
// little.
func readFrame(r io.Reader, buf []byte, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return buf[:0], err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if uint64(size) > uint64(limit) {
		return buf[:0], fmt.Errorf("rpcwire: frame of %d bytes is over the limit of %d", size, limit)
	}
	n := int(size)
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(n-len(buf), max(len(buf), 64<<10)))
		}
		m, err := r.Read(buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil && len(buf) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
	}
	return buf, nil
}

var errMalformed = errors.New("rpcwire: malformed frame")

// parseRequest splits a request frame's body. The method and message
// alias b.
func parseRequest(b []byte) (request, error) {
	if len(b) < 6 {
		return request{}, errMalformed
	}
	var r request
	r.timeoutMS = binary.BigEndian.Uint32(b)
	n := int(binary.BigEndian.Uint16(b[4:]))
	if n == 0 || n > maxMethod || len(b) < 6+n {
		return request{}, errMalformed
	}
	r.method = string(b[6 : 6+n])
	r.msg = b[6+n:]
	return r, nil
}

// appendReply appends a reply frame to b.
func appendReply(b, status, msg []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(status)+len(msg)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(status)))
	b = append(b, status...)
	return append(b, msg...)
}

// parseReply splits a reply frame's body; both parts alias b.
func parseReply(b []byte) (status, msg []byte, err error) {
	if len(b) < 4 {
		return nil, nil, errMalformed
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, errMalformed
	}
	return b[4 : 4+n], b[4+n:], nil
}
