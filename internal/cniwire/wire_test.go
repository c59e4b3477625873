package cniwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	in := Request{Method: "/skein.v1.CNI/Add", TimeoutMS: 1500, Body: []byte("body")}
	b := AppendRequest(nil, in)
	if !bytes.HasPrefix(b, []byte(RequestMagic)) {
		t.Fatalf("no magic: %q", b)
	}
	got, err := ReadRequest(bytes.NewReader(b[len(RequestMagic):]))
	if err != nil || got.Method != in.Method || got.TimeoutMS != in.TimeoutMS || !bytes.Equal(got.Body, in.Body) {
		t.Fatalf("read %+v, %v; want %+v", got, err, in)
	}
}

// TestReadRequestRefuses: what a peer cannot make the server do — read
// a method of 0 or more than MaxMethod bytes, allocate a body over
// MaxBody, or take a request cut short.
func TestReadRequestRefuses(t *testing.T) {
	frame := func(method string, body uint32) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(len(method)))
		b = append(b, method...)
		b = binary.BigEndian.AppendUint32(b, 0)
		return binary.BigEndian.AppendUint32(b, body)
	}
	for name, in := range map[string][]byte{
		"no method":       frame("", 0),
		"method too long": frame(strings.Repeat("m", MaxMethod+1), 0),
		"body too large":  frame("/s/M", MaxBody+1),
		"cut short":       frame("/s/M", 10),
		"empty":           nil,
	} {
		if _, err := ReadRequest(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	in := Reply{Code: 9, Message: "pool \"p\" is full", Body: []byte{1, 2, 3}}
	b := append([]byte(AckMagic), AppendReply(nil, in)...)
	r := bytes.NewReader(b)
	if err := ReadAck(r); err != nil {
		t.Fatal(err)
	}
	got, err := ReadReply(r)
	if err != nil || got.Code != in.Code || got.Message != in.Message || !bytes.Equal(got.Body, in.Body) {
		t.Fatalf("read %+v, %v; want %+v", got, err, in)
	}
	long := AppendReply(nil, Reply{Message: strings.Repeat("x", MaxMessage+10)})
	if got, err := ReadReply(bytes.NewReader(long)); err != nil || len(got.Message) != MaxMessage {
		t.Errorf("a long message: %d bytes, %v; want it cut to %d", len(got.Message), err, MaxMessage)
	}
}

// TestReadAck: an HTTP/2 server's first bytes (a SETTINGS frame), anything
// else or an early end mean the peer does not speak this protocol; a read
// error is passed on as it is.
func TestReadAck(t *testing.T) {
	for name, in := range map[string]string{
		"http/2 settings": "\x00\x00\x06\x04\x00\x00\x00\x00\x00",
		"other bytes":     "HTTP/1.1 400",
		"ends early":      AckMagic[:5],
		"nothing":         "",
	} {
		if err := ReadAck(strings.NewReader(in)); !errors.Is(err, ErrNotSkeinWire) {
			t.Errorf("%s: %v, want ErrNotSkeinWire", name, err)
		}
	}
	boom := errors.New("boom")
	if err := ReadAck(io.MultiReader(strings.NewReader(AckMagic[:4]), errReader{boom})); !errors.Is(err, boom) {
		t.Errorf("read error: %v, want it passed on", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// FuzzReadRequest: any bytes after the magic are either refused or a
// request whose frame is exactly the bytes read.
func FuzzReadRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{Method: "/skein.v1.CNI/Add", TimeoutMS: 10, Body: []byte("x")})[len(RequestMagic):])
	f.Add([]byte{0, 4, '/', 'a', '/', 'b', 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		req, err := ReadRequest(r)
		if err != nil {
			return
		}
		used := in[:len(in)-r.Len()]
		if again := AppendRequest(nil, req)[len(RequestMagic):]; !bytes.Equal(again, used) {
			t.Fatalf("read %+v from %q, which frames as %q", req, used, again)
		}
		if len(req.Method) == 0 || len(req.Method) > MaxMethod || len(req.Body) > MaxBody {
			t.Fatalf("accepted %d-byte method, %d-byte body", len(req.Method), len(req.Body))
		}
	})
}
