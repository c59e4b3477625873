package cniclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// The seed corpus under testdata/fuzz/FuzzReply is what grpc-go's server
// (the one skeind runs) wrote back on the connection for real calls made
// with Call, recorded by a proxy between the two: a result, a CNI error, an
// empty reply, a status error with a percent-encoded message, an unknown
// method (a trailers-only reply), a result spanning two DATA frames, and a
// call answered during GracefulStop (GOAWAY first).

// FuzzReply feeds the bytes to the gRPC call as the server's side of the
// connection, then closes it. Call must return before its deadline, with
// either a reply or a *StatusError; it must refuse a frame larger than
// the 16 KiB it allows; and a reply it accepts must be what the DATA
// frames of stream 1 carried, up to the frame that ended the stream.
func FuzzReply(f *testing.F) {
	l, sock := listenUnix(f)

	f.Fuzz(func(t *testing.T, server []byte) {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			drained := make(chan struct{})
			go func() { io.Copy(io.Discard, c); close(drained) }()
			c.Write(server)
			c.(*net.UnixConn).CloseWrite()
			select {
			case <-drained: // the client hung up
			case <-time.After(10 * time.Second):
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rep, err := callGRPC(ctx, sock, "/skein.v1.CNI/Add", encodeRequest(Request{ContainerID: "fuzz", IfName: "eth0"}))
		if ctx.Err() != nil {
			t.Fatalf("Call was still reading when its deadline came (the server had closed): %v", err)
		}
		cancel()
		<-served

		ref := readStream1(server)
		if err != nil {
			var se *StatusError
			if !errors.As(err, &se) || se.Code == 0 {
				t.Fatalf("Call failed with %#v, want a *StatusError with a code", err)
			}
			return
		}
		switch {
		case ref.oversized:
			t.Fatalf("accepted a reply with a frame over %d bytes", defaultMaxFrame)
		case !ref.ended:
			t.Fatal("accepted a reply whose stream never ended")
		}
		want, derr := decodeGRPCFrame(ref.data)
		if derr != nil {
			t.Fatalf("accepted a reply whose DATA (%q) is not one gRPC message: %v", ref.data, derr)
		}
		if !bytes.Equal(rep.Result, want.Result) || (rep.Error == nil) != (want.Error == nil) ||
			rep.Error != nil && *rep.Error != *want.Error {
			t.Fatalf("reply %+v, the stream carried %+v", rep, want)
		}
	})
}

// stream1 is what a plain reading of the server's frames gives.
type stream1 struct {
	data      []byte // DATA payloads of stream 1, padding removed
	ended     bool   // a frame ended stream 1
	oversized bool   // a frame over the default maximum came before that
}

// readStream1 walks the frames as RFC 9113 lays them out, without flow
// control or header decoding: only where stream 1 ends and what its DATA
// frames carried.
func readStream1(b []byte) stream1 {
	var s stream1
	headersEnd := false // END_STREAM seen on HEADERS, waiting for END_HEADERS
	for len(b) >= 9 {
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		typ, flags := b[3], b[4]
		stream := binary.BigEndian.Uint32(b[5:]) & 0x7fffffff
		if n > defaultMaxFrame {
			s.oversized = true
			return s
		}
		if len(b) < 9+n {
			return s
		}
		p := b[9 : 9+n]
		b = b[9+n:]
		if stream != 1 {
			continue
		}
		switch typ {
		case frameData:
			if flags&flagPadded != 0 {
				if len(p) < 1 || int(p[0]) > len(p)-1 {
					return s
				}
				p = p[1 : len(p)-int(p[0])]
			}
			s.data = append(s.data, p...)
			if flags&flagEndStream != 0 {
				s.ended = true
				return s
			}
		case frameHeaders:
			headersEnd = flags&flagEndStream != 0
			if headersEnd && flags&flagEndHeaders != 0 {
				s.ended = true
				return s
			}
		case frameContinuation:
			if headersEnd && flags&flagEndHeaders != 0 {
				s.ended = true
				return s
			}
		}
	}
	return s
}

// decodeGRPCFrame reads one length-prefixed, uncompressed gRPC message
// holding a CNIReply.
func decodeGRPCFrame(b []byte) (*Reply, error) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		return nil, errors.New("not one gRPC message")
	}
	return decodeReply(b[5:])
}
