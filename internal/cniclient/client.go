package cniclient

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/skeinnet/skein/internal/cniwire"
)

// Request mirrors skein.v1.CNIRequest.
type Request struct {
	ContainerID, NetNS, IfName, Args, Path string
	NetConf                                []byte
}

// Reply mirrors skein.v1.CNIReply.
type Reply struct {
	Result []byte
	Error  *Error // the CNI error skeind answered with, if any
}

// Error mirrors skein.v1.CNIError: a CNI spec error.
type Error struct {
	Code         uint32
	Msg, Details string
}

// StatusError is a gRPC-level failure (the call did not complete).
type StatusError struct {
	Code    int // gRPC status code
	Message string
}

func (e *StatusError) Error() string { return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message) }

// gRPC status codes the caller branches on.
const (
	CodeCanceled         = 1
	CodeDeadlineExceeded = 4
	CodeUnavailable      = 14
)

// ErrUnavailable wraps failures to reach the socket at all.
var ErrUnavailable = errors.New("skeind unavailable")

// Call invokes /skein.v1.CNI/<method> on the daemon at socket.
func Call(ctx context.Context, socket, method string, req Request) (*Reply, error) {
	return CallService(ctx, socket, "skein.v1.CNI", method, req)
}

// CallService invokes /<service>/<method> for any of skeind's services that
// take a CNIRequest and answer a CNIReply (skein.v1.CNI, skein.v1.VM).
//
// The call goes over skeind's short path (package cniwire) and, when the
// daemon does not speak it (an older skeind), over gRPC.
func CallService(ctx context.Context, socket, service, method string, req Request) (*Reply, error) {
	path, body := "/"+service+"/"+method, encodeRequest(req)
	rep, err := callWire(ctx, socket, path, body)
	if !errors.Is(err, cniwire.ErrNotSkeinWire) {
		return rep, err
	}
	return callGRPC(ctx, socket, path, body)
}

// callWire makes the call over the short path: ErrNotSkeinWire when the
// peer does not speak it (nothing ran).
func callWire(ctx context.Context, socket, path string, body []byte) (*Reply, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer conn.Close()
	var timeout uint32
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
		timeout = uint32(min(max(time.Until(dl).Milliseconds(), 1), math.MaxUint32))
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(cniwire.AppendRequest(nil, cniwire.Request{Method: path, TimeoutMS: timeout, Body: body})); err != nil {
		if ctx.Err() == nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			return nil, fmt.Errorf("%w: %v", cniwire.ErrNotSkeinWire, err)
		}
		return nil, callErr(ctx, err)
	}
	br := bufio.NewReader(conn)
	if err := cniwire.ReadAck(br); err != nil {
		if ctx.Err() == nil && errors.Is(err, syscall.ECONNRESET) {
			// Closed on us before any answer: an old skeind refusing
			// what it took for a bad HTTP/2 preface.
			err = fmt.Errorf("%w: %v", cniwire.ErrNotSkeinWire, err)
		}
		if errors.Is(err, cniwire.ErrNotSkeinWire) {
			return nil, err
		}
		return nil, callErr(ctx, err)
	}
	rep, err := cniwire.ReadReply(br)
	if err != nil {
		return nil, callErr(ctx, err)
	}
	if rep.Code != cniwire.CodeOK {
		return nil, &StatusError{Code: int(rep.Code), Message: rep.Message}
	}
	return decodeReply(rep.Body)
}

// CallServiceGRPC is CallService over gRPC alone, the path to a skeind
// without the short one (benchmarks compare the two).
func CallServiceGRPC(ctx context.Context, socket, service, method string, req Request) (*Reply, error) {
	return callGRPC(ctx, socket, "/"+service+"/"+method, encodeRequest(req))
}

// callGRPC makes the call as a unary gRPC call on a connection of its
// own.
func callGRPC(ctx context.Context, socket, path string, body []byte) (*Reply, error) {
	timeout := ""
	if dl, ok := ctx.Deadline(); ok {
		timeout = timeoutHeader(dl)
	}
	rep, err := unary(ctx, socket, path, body, timeout)
	if err != nil {
		return nil, err
	}
	// Status travels in the trailers, or alone in a trailers-only reply.
	if rep.status != "0" {
		code, err := strconv.Atoi(rep.status)
		if err != nil {
			code = 2 // Unknown
		}
		msg := rep.msg
		if m, err := url.PathUnescape(msg); err == nil {
			msg = m
		}
		return nil, &StatusError{Code: code, Message: msg}
	}
	data := rep.message
	if len(data) < 5 || data[0] != 0 || int(binary.BigEndian.Uint32(data[1:5])) != len(data)-5 {
		return nil, &StatusError{Code: 13, Message: "malformed gRPC reply frame"}
	}
	return decodeReply(data[5:])
}

// encodeRequest writes skein.v1.CNIRequest (field numbers from skein.proto).
func encodeRequest(r Request) []byte {
	var b []byte
	str := func(num int32, s string) {
		if s != "" {
			b = appendTag(b, num, wireBytes)
			b = appendBytes(b, []byte(s))
		}
	}
	str(1, r.ContainerID)
	str(2, r.NetNS)
	str(3, r.IfName)
	str(4, r.Args)
	str(5, r.Path)
	if len(r.NetConf) > 0 {
		b = appendTag(b, 6, wireBytes)
		b = appendBytes(b, r.NetConf)
	}
	return b
}

// decodeReply reads skein.v1.CNIReply, skipping unknown fields.
func decodeReply(b []byte) (*Reply, error) {
	r := &Reply{}
	err := fields(b, func(num int32, typ int, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == wireBytes:
			r.Result = append([]byte(nil), v...)
		case num == 2 && typ == wireBytes:
			r.Error = &Error{}
			return fields(v, func(num int32, typ int, v []byte, n uint64) error {
				switch {
				case num == 1 && typ == wireVarint:
					r.Error.Code = uint32(n)
				case num == 2 && typ == wireBytes:
					r.Error.Msg = string(v)
				case num == 3 && typ == wireBytes:
					r.Error.Details = string(v)
				}
				return nil
			})
		}
		return nil
	})
	return r, err
}

// fields walks a protobuf message, calling f with each field's bytes (for
// length-delimited fields) or value (varints).
func fields(b []byte, f func(num int32, typ int, v []byte, val uint64) error) error {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return &StatusError{Code: 13, Message: "malformed reply: " + err.Error()}
		}
		b = b[n:]
		v, val, n, err := consumeValue(num, typ, b, maxGroupDepth)
		if err != nil {
			return &StatusError{Code: 13, Message: "malformed reply: " + err.Error()}
		}
		b = b[n:]
		if err := f(num, typ, v, val); err != nil {
			return err
		}
	}
	return nil
}
