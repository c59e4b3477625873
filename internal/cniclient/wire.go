package cniclient

// This file is the little of the protobuf wire format (protobuf.dev,
// "Encoding") that one CNIRequest and one CNIReply need: tags, varints and
// length-delimited fields, and skipping whatever else a newer skeind may
// send. google.golang.org/protobuf/encoding/protowire would do it too, but
// importing it runs the protobuf module's init, which reads and hashes the
// plugin's own executable on every exec.

// Wire types.
const (
	wireVarint     = 0
	wireFixed64    = 1
	wireBytes      = 2
	wireStartGroup = 3
	wireEndGroup   = 4
	wireFixed32    = 5
)

// maxGroupDepth bounds nested groups when skipping them, as protowire does.
const maxGroupDepth = 10000

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendTag(b []byte, num int32, typ int) []byte {
	return appendVarint(b, uint64(num)<<3|uint64(typ))
}

func appendBytes(b []byte, v []byte) []byte {
	return append(appendVarint(b, uint64(len(v))), v...)
}

// wireError is why a message could not be read.
type wireError string

func (e wireError) Error() string { return string(e) }

const (
	errTruncated   wireError = "unexpected EOF"
	errOverflow    wireError = "variable length integer overflow"
	errFieldNumber wireError = "invalid field number"
	errReserved    wireError = "cannot parse reserved wire type"
	errEndGroup    wireError = "mismatching end group marker"
	errDepth       wireError = "exceeded maximum recursion depth"
)

// consumeVarint reads a varint of at most ten bytes.
func consumeVarint(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		if i >= len(b) {
			return 0, 0, errTruncated
		}
		c := b[i]
		if i == 9 && c > 1 {
			return 0, 0, errOverflow
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1, nil
		}
	}
	return 0, 0, errOverflow
}

// consumeTag reads a field's number (1 to 2³¹-1) and wire type.
func consumeTag(b []byte) (int32, int, int, error) {
	v, n, err := consumeVarint(b)
	if err != nil {
		return 0, 0, 0, err
	}
	if v>>3 == 0 || v>>3 > 1<<31-1 {
		return 0, 0, 0, errFieldNumber
	}
	return int32(v >> 3), int(v & 7), n, nil
}

// consumeValue reads the value of a field of wire type typ: its bytes for
// wireBytes, its number for wireVarint, and its length in b for all.
func consumeValue(num int32, typ int, b []byte, depth int) (v []byte, val uint64, n int, err error) {
	switch typ {
	case wireVarint:
		val, n, err = consumeVarint(b)
		return nil, val, n, err
	case wireFixed64, wireFixed32:
		size := 8
		if typ == wireFixed32 {
			size = 4
		}
		if len(b) < size {
			return nil, 0, 0, errTruncated
		}
		return nil, 0, size, nil
	case wireBytes:
		l, m, err := consumeVarint(b)
		if err != nil {
			return nil, 0, 0, err
		}
		if l > uint64(len(b)-m) {
			return nil, 0, 0, errTruncated
		}
		return b[m : m+int(l)], 0, m + int(l), nil
	case wireStartGroup:
		if depth <= 0 {
			return nil, 0, 0, errDepth
		}
		for off := 0; ; {
			gnum, gtyp, m, err := consumeTag(b[off:])
			if err != nil {
				return nil, 0, 0, err
			}
			off += m
			if gtyp == wireEndGroup {
				if gnum != num {
					return nil, 0, 0, errEndGroup
				}
				return nil, 0, off, nil
			}
			_, _, m, err = consumeValue(gnum, gtyp, b[off:], depth-1)
			if err != nil {
				return nil, 0, 0, err
			}
			off += m
		}
	case wireEndGroup:
		return nil, 0, 0, errEndGroup
	}
	return nil, 0, 0, errReserved
}
