package cniclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"golang.org/x/net/http2/hpack"
)

// This file is the HTTP/2 half of one unary gRPC call, over a connection
// that carries nothing else: client preface and SETTINGS, one request on
// stream 1 (HEADERS, then the message in DATA frames within the peer's flow
// control windows), then frames are read until stream 1 ends, answering
// SETTINGS and PING and returning flow-control credit for what arrives.
// Headers are (de)compressed by x/net/http2/hpack. golang.org/x/net/http2's
// Transport would do all this too, but it links net/http, whose start-up
// the plugin pays on every exec (~0.4 ms on our machines): see the package
// doc. RFC 9113 section numbers are given where a rule is applied.

const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5

	defaultWindow   = 65535 // §6.9.2
	defaultMaxFrame = 16384 // §6.5.2
	maxReplyBytes   = 16 << 20
	maxHeaderBlock  = 64 << 10

	errCodeCancel = 0x8
)

const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2Reply is what came back on the stream.
type h2Reply struct {
	message []byte // the gRPC message, without its 5-byte prefix
	status  string // grpc-status ("" if absent)
	msg     string // grpc-message, percent-encoded
	httpSt  string // :status
}

// unary performs POST path with the gRPC-framed message body on a new
// connection to the UNIX socket.
func unary(ctx context.Context, socket, path string, body []byte, timeout string) (*h2Reply, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// Cancellation without a deadline: unblock the reads.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	c := &h2conn{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn),
		sendWin: defaultWindow, streamWin: defaultWindow, peerInitWin: defaultWindow, maxFrame: defaultMaxFrame}
	c.dec = hpack.NewDecoder(4096, nil)

	// Preface, our (empty) SETTINGS, the request HEADERS.
	c.w.WriteString(clientPreface)
	// SETTINGS_ENABLE_PUSH = 0: no server push (§8.4).
	c.writeFrame(frameSettings, 0, 0, []byte{0, 0x2, 0, 0, 0, 0})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "skeind"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if timeout != "" {
		enc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: timeout})
	}
	c.writeFrame(frameHeaders, flagEndHeaders, 1, hb.Bytes())

	frame := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
	c.pending = append(frame, body...)
	if err := c.sendData(); err != nil {
		return nil, c.fail(ctx, err)
	}
	reply, err := c.readUntilEnd()
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	return reply, nil
}

type h2conn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	dec  *hpack.Decoder

	pending             []byte // request bytes not yet sent
	sent                bool   // END_STREAM sent
	sendWin, streamWin  int64  // peer's connection and stream windows
	peerInitWin         int64  // peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame            int
	headerBlock         []byte
	headerEndsStream    bool
	inHeaders, gotFirst bool
	reply               h2Reply
	data                []byte
}

// errCanceledByPeer: the server reset our stream with CANCEL, which grpc-go
// does when the grpc-timeout we sent runs out.
var errCanceledByPeer = errors.New("stream reset by peer: CANCEL")

func (c *h2conn) fail(ctx context.Context, err error) error { return callErr(ctx, err) }

// callErr turns a failed call into the StatusError the caller sees.
func callErr(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return &StatusError{Code: CodeCanceled, Message: "canceled: " + err.Error()}
	}
	if ctx.Err() != nil || errors.Is(err, errCanceledByPeer) {
		return &StatusError{Code: CodeDeadlineExceeded, Message: "deadline exceeded: " + err.Error()}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &StatusError{Code: CodeDeadlineExceeded, Message: "deadline exceeded: " + err.Error()}
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se
	}
	return &StatusError{Code: CodeUnavailable, Message: err.Error()}
}

func (c *h2conn) writeFrame(typ, flags byte, stream uint32, payload []byte) {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream&0x7fffffff)
	c.w.Write(h[:])
	c.w.Write(payload)
}

// sendData writes as much of the request as the peer's windows allow
// (§6.9), ending the stream with the last byte, and flushes.
func (c *h2conn) sendData() error {
	for !c.sent {
		n := min(int64(len(c.pending)), c.sendWin, c.streamWin, int64(c.maxFrame))
		if n <= 0 && len(c.pending) > 0 {
			break // wait for WINDOW_UPDATE
		}
		chunk := c.pending[:n]
		c.pending = c.pending[n:]
		var flags byte
		if len(c.pending) == 0 {
			flags = flagEndStream
			c.sent = true
		}
		c.writeFrame(frameData, flags, 1, chunk)
		c.sendWin -= n
		c.streamWin -= n
	}
	return c.w.Flush()
}

// readUntilEnd reads frames until stream 1 is closed by the peer.
func (c *h2conn) readUntilEnd() (*h2Reply, error) {
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return nil, fmt.Errorf("read frame: %w", err)
		}
		length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := hdr[3], hdr[4]
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		// We never raise SETTINGS_MAX_FRAME_SIZE, so larger frames are a
		// protocol error (§4.2).
		if length > defaultMaxFrame {
			return nil, fmt.Errorf("protocol error: frame of %d bytes", length)
		}
		payload := make([]byte, length)
		if _, err := io.ReadFull(c.r, payload); err != nil {
			return nil, fmt.Errorf("read frame: %w", err)
		}
		if c.inHeaders && typ != frameContinuation {
			return nil, errors.New("protocol error: header block interrupted (§6.10)")
		}
		done, err := c.handle(typ, flags, stream, payload)
		if err != nil {
			return nil, err
		}
		if done {
			c.reply.message = c.data
			return &c.reply, nil
		}
		if err := c.w.Flush(); err != nil {
			return nil, err
		}
	}
}

// handle processes one frame; done reports that stream 1 has ended.
func (c *h2conn) handle(typ, flags byte, stream uint32, p []byte) (done bool, err error) {
	switch typ {
	case frameSettings:
		if stream != 0 || flags&flagAck != 0 {
			return false, nil
		}
		for ; len(p) >= 6; p = p[6:] {
			id, v := binary.BigEndian.Uint16(p), binary.BigEndian.Uint32(p[2:])
			switch id {
			case settingInitialWindowSize: // §6.9.2: the change since the last value
				if v > 1<<31-1 {
					return false, errors.New("protocol error: SETTINGS_INITIAL_WINDOW_SIZE too large")
				}
				c.streamWin += int64(v) - c.peerInitWin
				c.peerInitWin = int64(v)
			case settingMaxFrameSize: // §6.5.2
				if v < defaultMaxFrame || v > 1<<24-1 {
					return false, errors.New("protocol error: SETTINGS_MAX_FRAME_SIZE out of range")
				}
				c.maxFrame = int(v)
			}
		}
		c.writeFrame(frameSettings, flagAck, 0, nil)
		return false, c.sendData()
	case framePing:
		if flags&flagAck == 0 {
			c.writeFrame(framePing, flagAck, 0, p)
		}
	case frameWindowUpdate:
		if len(p) != 4 {
			return false, errors.New("protocol error: WINDOW_UPDATE size")
		}
		inc := int64(binary.BigEndian.Uint32(p) & 0x7fffffff)
		if stream == 0 {
			c.sendWin += inc
		} else if stream == 1 {
			c.streamWin += inc
		}
		return false, c.sendData()
	case frameGoAway:
		// A graceful shutdown announces itself with a GOAWAY whose last
		// stream ID covers ours: stream 1 is still served (§6.8).
		if len(p) < 8 {
			return false, errors.New("protocol error: short GOAWAY")
		}
		if binary.BigEndian.Uint32(p)&0x7fffffff < 1 {
			return false, errors.New("server sent GOAWAY before serving the call")
		}
	case frameRSTStream:
		if stream == 1 {
			if len(p) == 4 && binary.BigEndian.Uint32(p) == errCodeCancel {
				return false, errCanceledByPeer
			}
			return false, fmt.Errorf("stream reset by peer (code %d)", binary.BigEndian.Uint32(append(p, 0, 0, 0, 0)))
		}
	case frameData:
		if stream != 1 {
			return false, nil
		}
		body, err := unpad(flags, p)
		if err != nil {
			return false, err
		}
		if len(c.data)+len(body) > maxReplyBytes {
			return false, errors.New("reply too large")
		}
		c.data = append(c.data, body...)
		// Give back the credit at once (§6.9): the reply may be larger
		// than the initial window.
		if n := len(p); n > 0 {
			var inc [4]byte
			binary.BigEndian.PutUint32(inc[:], uint32(n))
			c.writeFrame(frameWindowUpdate, 0, 0, inc[:])
			c.writeFrame(frameWindowUpdate, 0, 1, inc[:])
		}
		return flags&flagEndStream != 0, nil
	case frameHeaders:
		if stream != 1 {
			return false, errors.New("protocol error: HEADERS on a stream we did not open")
		}
		frag, err := unpad(flags, p)
		if err != nil {
			return false, err
		}
		if flags&flagPriority != 0 {
			if len(frag) < 5 {
				return false, errors.New("protocol error: short HEADERS priority")
			}
			frag = frag[5:]
		}
		if len(frag) > maxHeaderBlock {
			return false, errors.New("header block too large")
		}
		c.headerBlock = append(c.headerBlock[:0], frag...)
		c.headerEndsStream = flags&flagEndStream != 0
		c.inHeaders = flags&flagEndHeaders == 0
		if c.inHeaders {
			return false, nil
		}
		return c.endHeaders()
	case frameContinuation:
		if !c.inHeaders || stream != 1 {
			return false, errors.New("protocol error: unexpected CONTINUATION")
		}
		if len(c.headerBlock)+len(p) > maxHeaderBlock {
			return false, errors.New("header block too large")
		}
		c.headerBlock = append(c.headerBlock, p...)
		c.inHeaders = flags&flagEndHeaders == 0
		if c.inHeaders {
			return false, nil
		}
		return c.endHeaders()
	}
	return false, nil
}

// endHeaders decodes a complete header block: the response headers, or the
// trailers (which end the stream).
func (c *h2conn) endHeaders() (bool, error) {
	fields, err := c.dec.DecodeFull(c.headerBlock)
	if err != nil {
		return false, fmt.Errorf("decode headers: %w", err)
	}
	for _, f := range fields {
		switch f.Name {
		case ":status":
			c.reply.httpSt = f.Value
		case "grpc-status":
			c.reply.status = f.Value
		case "grpc-message":
			c.reply.msg = f.Value
		}
	}
	if c.reply.httpSt != "" && c.reply.httpSt != "200" {
		return false, &StatusError{Code: CodeUnavailable, Message: "HTTP " + c.reply.httpSt}
	}
	return c.headerEndsStream, nil
}

func unpad(flags byte, p []byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, errors.New("protocol error: bad padding")
	}
	return p[1 : len(p)-int(p[0])], nil
}

func timeoutHeader(deadline time.Time) string {
	ms := time.Until(deadline).Milliseconds()
	switch {
	case ms < 1:
		ms = 1
	case ms > 99999999: // at most 8 digits
		return strconv.FormatInt(min(ms/1000, 99999999), 10) + "S"
	}
	return strconv.FormatInt(ms, 10) + "m"
}
