package cniclient

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// walkRef is fields done with protowire, the reference.
func walkRef(b []byte) (out []string, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return out, false
		}
		b = b[n:]
		var (
			v   []byte
			val uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			val, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return out, false
		}
		b = b[n:]
		out = append(out, fmt.Sprintf("%d/%d/%x/%d", num, typ, v, val))
	}
	return out, true
}

func walk(b []byte) (out []string, ok bool) {
	err := fields(b, func(num int32, typ int, v []byte, val uint64) error {
		out = append(out, fmt.Sprintf("%d/%d/%x/%d", num, typ, v, val))
		return nil
	})
	return out, err == nil
}

// FuzzFields: wire.go reads any bytes field by field exactly as protowire
// does, and fails where it fails.
func FuzzFields(f *testing.F) {
	rep := protowire.AppendTag(nil, 1, protowire.BytesType)
	rep = protowire.AppendBytes(rep, []byte(`{"cniVersion":"1.0.0"}`))
	e := protowire.AppendTag(nil, 1, protowire.VarintType)
	e = protowire.AppendVarint(e, 11)
	e = protowire.AppendTag(e, 2, protowire.BytesType)
	e = protowire.AppendString(e, "busy")
	rep = protowire.AppendTag(rep, 2, protowire.BytesType)
	rep = protowire.AppendBytes(rep, e)
	for _, seed := range [][]byte{
		rep, nil, {0}, {0x08}, {0x08, 0xff}, {0x0b, 0x10, 0x01, 0x0c}, {0x0b, 0x14}, {0x0d, 1, 2, 3, 4}, {0x09, 1},
		{0x0e}, {0x0f}, {0x0c}, {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, {0x0a, 0x80, 0x01}, {0xf8, 0xff, 0xff, 0xff, 0x0f, 0},
		{0xf8, 0xff, 0xff, 0xff, 0x7f, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, wantOK := walkRef(b)
		got, gotOK := walk(b)
		if gotOK != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%x: fields read %v (ok %v), protowire %v (ok %v)", b, got, gotOK, want, wantOK)
		}
	})
}

// TestEncodeRequest: the request is what protowire writes.
func TestEncodeRequest(t *testing.T) {
	r := Request{ContainerID: "c", NetNS: "/run/netns/p", IfName: "eth0", Args: "A=1", Path: "/opt/cni/bin", NetConf: bytes.Repeat([]byte("x"), 300)}
	var want []byte
	for i, s := range []string{r.ContainerID, r.NetNS, r.IfName, r.Args, r.Path, string(r.NetConf)} {
		want = protowire.AppendTag(want, protowire.Number(i+1), protowire.BytesType)
		want = protowire.AppendString(want, s)
	}
	if got := encodeRequest(r); !bytes.Equal(got, want) {
		t.Errorf("encodeRequest = %x, protowire %x", got, want)
	}
	if got := encodeRequest(Request{IfName: "eth0"}); !bytes.Equal(got, protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "eth0")) {
		t.Errorf("empty fields should be left out: %x", got)
	}
}
