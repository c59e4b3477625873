package cnirun

import "unicode/utf8"

// The binary needs two strings from the network configuration before
// skeind sees it: "socket", to know which skeind to call, and
// "cniVersion", to word an error when none answers. encoding/json would
// cost every exec its package start (with reflect and unicode); this reads
// them the way json.Unmarshal into a struct with one string field does
// (fuzz_test.go checks the two agree on any input):
//
//   - input that is not valid JSON sets nothing and is an error;
//   - null sets nothing; any other value that is not an object is an error;
//   - every member whose name folds to the field's as encoding/json folds
//     names is taken in order: a string sets the field, null leaves it,
//     anything else is an error but the decoding goes on.

// configString is the value of the configuration's top-level member key
// (ASCII, as both of ours are); bad is true when json.Unmarshal would have
// returned an error.
func configString(data []byte, key string) (val string, bad bool) {
	if !valid(data) {
		return "", true
	}
	s := scanner{b: data}
	s.space()
	switch s.peek() {
	case 'n':
		return "", false
	case '{':
	default:
		return "", true
	}
	s.i++
	for {
		s.space()
		if s.peek() == '}' {
			return val, bad
		}
		name := unquote(s.str())
		s.space()
		s.i++ // ':'
		s.space()
		start := s.i
		s.value()
		if foldEqual(name, key) {
			switch data[start] {
			case '"':
				val = unquote(data[start+1 : s.i-1])
			case 'n':
			default:
				bad = true
			}
		}
		s.space()
		if s.peek() == ',' {
			s.i++
		}
	}
}

// foldEqual compares a member's name with an ASCII field name as
// encoding/json does: each rune replaced by the least of its simple case
// folds. Of the runes beyond ASCII only two fold into ASCII that way (the
// test checks every rune): 'ſ' to 'S' and the Kelvin sign to 'K'.
func foldEqual(name, key string) bool {
	j := 0
	for _, r := range name {
		switch r {
		case 'ſ':
			r = 'S'
		case '\u212a':
			r = 'K'
		}
		if r >= utf8.RuneSelf || j >= len(key) || upper(byte(r)) != upper(key[j]) {
			return false
		}
		j++
	}
	return j == len(key)
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - 'a' + 'A'
	}
	return c
}

// maxDepth is encoding/json's limit on nesting.
const maxDepth = 10000

// scanner walks JSON that valid accepted; with bad input it stops at the
// first error (valid reports it).
type scanner struct {
	b     []byte
	i     int
	depth int
	err   bool
}

func valid(b []byte) bool {
	s := scanner{b: b}
	s.space()
	s.value()
	s.space()
	return !s.err && s.i == len(b)
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) {
	if s.peek() != c {
		s.err = true
		return
	}
	s.i++
}

func (s *scanner) value() {
	if s.err {
		return
	}
	switch c := s.peek(); {
	case c == '{' || c == '[':
		s.depth++
		if s.depth > maxDepth {
			s.err = true
			return
		}
		s.i++
		s.space()
		end := byte(']')
		if c == '{' {
			end = '}'
		}
		if s.peek() == end {
			s.i++
			s.depth--
			return
		}
		for !s.err {
			if c == '{' {
				if s.peek() != '"' {
					s.err = true
					return
				}
				s.str()
				s.space()
				s.expect(':')
				s.space()
			}
			s.value()
			s.space()
			if s.peek() == ',' {
				s.i++
				s.space()
				continue
			}
			s.expect(end)
			s.depth--
			return
		}
	case c == '"':
		s.str()
	case c == '-' || '0' <= c && c <= '9':
		s.number()
	case c == 't':
		s.literal("true")
	case c == 'f':
		s.literal("false")
	case c == 'n':
		s.literal("null")
	default:
		s.err = true
	}
}

func (s *scanner) literal(w string) {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		s.err = true
		return
	}
	s.i += len(w)
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case '1' <= c && c <= '9':
		s.digits()
	default:
		s.err = true
		return
	}
	if s.peek() == '.' {
		s.i++
		if s.digits() == 0 {
			s.err = true
			return
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if s.digits() == 0 {
			s.err = true
		}
	}
}

// str reads a string and returns what is between its quotes, escapes
// not decoded.
func (s *scanner) str() []byte {
	s.expect('"')
	start := s.i
	for !s.err {
		if s.i >= len(s.b) {
			s.err = true
			break
		}
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1]
		case c < 0x20:
			s.err = true
		case c == '\\':
			s.i++
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				s.i++
				if hex4(s.b[s.i:]) < 0 {
					s.err = true
				}
				s.i += 4
			default:
				s.err = true
			}
		default:
			s.i++
		}
	}
	return nil
}

// hex4 is the value of four hex digits at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// unquote decodes a valid string's contents as encoding/json does:
// escapes, surrogate pairs, and U+FFFD for invalid UTF-8 and lone
// surrogates.
func unquote(b []byte) string {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '\\':
			e := b[i+1]
			i += 2
			switch e {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := hex4(b[i:])
				i += 4
				if 0xd800 <= r && r < 0xdc00 && len(b) >= i+6 && b[i] == '\\' && b[i+1] == 'u' {
					if lo := hex4(b[i+2:]); 0xdc00 <= lo && lo < 0xe000 {
						r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
						i += 6
					}
				}
				if 0xd800 <= r && r < 0xe000 {
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
			default: // '"', '\\', '/'
				out = append(out, e)
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			out = utf8.AppendRune(out, r)
			i += n
		}
	}
	return string(out)
}
