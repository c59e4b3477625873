package cnirun

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// decodeStd is what configString stands in for: json.Unmarshal into a
// struct with one string field (the two the binaries read).
func decodeStd(data []byte, key string) (string, bool) {
	var s struct {
		Socket string `json:"socket"`
	}
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if key == "socket" {
		err := json.Unmarshal(data, &s)
		return s.Socket, err != nil
	}
	err := json.Unmarshal(data, &v)
	return v.CNIVersion, err != nil
}

var jsonSeeds = []string{
	``, ` `, `null`, ` null `, `nul`, `true`, `1`, `"s"`, `[]`, `[1,2]`, `{}`, `{ }`, `{`, `}`, `{"a":1,}`, `{,}`,
	`{"socket":"/run/x.sock"}`, `{"socket":"/a","socket":"/b"}`, `{"socket":"/a","socket":null}`,
	`{"socket":"/a","socket":1}`, `{"socket":1,"socket":"/a"}`, `{"socket":null}`, `{"socket":{}}`, `{"socket":[]}`,
	`{"SOCKET":"/up"}`, `{"Socket":"/up"}`, `{"ſocket":"/long-s"}`, `{"soc\u212aet":"/kelvin"}`, `{"soc\u006bet":"/esc"}`,
	`{"socket":"a\"b\\c\/d\b\f\n\r\t"}`, `{"socket":"\u00e9\ud83d\ude00"}`, `{"socket":"\ud83d"}`, `{"socket":"\ude00x"}`,
	`{"socket":"\ud83d\u0041"}`, `{"socket":"\ud83d\ud83d\ude00"}`, "{\"socket\":\"\xff\xfe\"}", "{\"socket\":\"a\x01\"}",
	`{"socket":"\x"}`, `{"socket":"\u12"}`, `{"socket":"\u12g4"}`, `{"socket":"/a"} x`, `{"socket":"/a"}` + "\n\t ",
	`{"a":{"socket":"/nested"},"b":[1,{"socket":"/n2"}]}`, `{"a":-0.5e+3,"b":1E9,"c":-0,"socket":"/n"}`,
	`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":+1}`, `{"a":tru}`, `{"a":falsey}`, `{"a" 1}`,
	`{1:2}`, `{"a":1 "b":2}`, `[` + strings.Repeat(`[`, 10001) + strings.Repeat(`]`, 10002),
	`{"x":` + strings.Repeat(`[`, 9999) + strings.Repeat(`]`, 9999) + `,"socket":"/deep"}`,
	`{"cniVersion":"1.0.0","CNIVERSION":"0.4.0"}`, `{"cnİversion":"0.3.1"}`, `{"cniVersion":1.0}`,
	`{"cniVersion":"1.0.0","name":"n","type":"skein","socket":"/run/skein/a.sock","ipam":{"pools":["p"]}}`,
}

// FuzzConfigString: configString reads "socket" and "cniVersion" exactly
// as json.Unmarshal does, valid JSON or not.
func FuzzConfigString(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, key := range []string{"socket", "cniVersion"} {
			got, gotBad := configString(data, key)
			want, wantBad := decodeStd(data, key)
			if got != want || gotBad != wantBad {
				t.Errorf("%q, %s: configString = %q, bad %v; encoding/json = %q, error %v", data, key, got, gotBad, want, wantBad)
			}
		}
	})
}

// TestFoldEqual: the runes foldEqual maps into ASCII are all the runes
// encoding/json's folding (the least rune of each simple fold orbit) maps
// there.
func TestFoldEqual(t *testing.T) {
	for r := rune(utf8.RuneSelf); r <= unicode.MaxRune; r++ {
		f := r
		for g := unicode.SimpleFold(r); g != r; g = unicode.SimpleFold(g) {
			f = min(f, g)
		}
		if f >= utf8.RuneSelf {
			continue
		}
		key := strings.ToLower(string(f))
		if !foldEqual(string(r), key) {
			t.Errorf("%U folds to %q for encoding/json but not for foldEqual", r, f)
		}
	}
	for _, c := range []struct {
		name, key string
		want      bool
	}{
		{"socket", "socket", true}, {"SoCkEt", "socket", true}, {"sockets", "socket", false}, {"socke", "socket", false},
		{"ſocket", "socket", true}, {"soc\u212aet", "socket", true}, {"cnİVersion", "cniVersion", false}, {"sócket", "socket", false},
	} {
		if got := foldEqual(c.name, c.key); got != c.want {
			t.Errorf("foldEqual(%q, %q) = %v", c.name, c.key, got)
		}
	}
}
