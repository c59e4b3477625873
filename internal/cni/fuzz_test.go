package cni

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// The seed corpora under testdata/fuzz are real inputs: what libcni
// (v1.3.1, the library containerd, CRI-O and podman use) wrote on the
// plugin's stdin and put in CNI_ARGS for ADD, CHECK and DEL of the
// conflists in deploy/ and test/ (skein alone in every spec version;
// chained after another plugin, so with a prevResult; with the "ips" and
// "portMappings" capabilities; before skein-vm; old single .conf files),
// recorded by a plugin that copied its stdin and environment to files.

// FuzzParse: Parse never panics; it refuses with a spec error that has a
// code and a message; a configuration it accepts encodes and parses back
// to the same configuration, and results can be built from it.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) || e.Code == 0 || e.Msg == "" {
				t.Fatalf("Parse refused %q with %#v: want a spec error with a code and a message", data, err)
			}
			return
		}
		enc, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("accepted configuration does not encode: %v", err)
		}
		back, err := Parse(enc)
		if err != nil {
			t.Fatalf("encoded configuration %s is refused: %v", enc, err)
		}
		if a, b := normalized(c), normalized(back); !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed the configuration:\n in: %s\nenc: %s\n%+v\n%+v", data, enc, a, b)
		}

		// What skeind does with an accepted configuration must not panic
		// either, whatever prevResult held.
		if res, err := BuildResult(c, attached); err == nil {
			if _, err := Encode(res, c.CNIVersion); err != nil {
				checkSpecError(t, "Encode", err)
			}
		} else {
			checkSpecError(t, "BuildResult", err)
		}
		if _, err := PrevAddrs(c, "eth0"); err != nil {
			checkSpecError(t, "PrevAddrs", err)
		}
		if _, err := StaticIPs(c, ""); err != nil {
			checkSpecError(t, "StaticIPs", err)
		}
	})
}

// FuzzArgs: CNI_ARGS parsing never panics, refuses with a spec error, and
// what it accepts reads back the same when written the way libcni joins
// RuntimeConf.Args; the static addresses taken from IP= are valid, at most
// one per family, each one given in IP=.
func FuzzArgs(f *testing.F) {
	conf, err := Parse([]byte(`{"cniVersion":"1.1.0","name":"n","type":"skein"}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, args string) {
		kv, err := ParseArgs(args)
		if err != nil {
			checkSpecError(t, "ParseArgs", err)
			return
		}
		var pairs []string
		for k, v := range kv {
			if k == "" || strings.Contains(k, ";") || strings.Contains(v, ";") {
				t.Fatalf("ParseArgs(%q) gave key %q value %q", args, k, v)
			}
			pairs = append(pairs, k+"="+v)
		}
		again, err := ParseArgs(strings.Join(pairs, ";"))
		if err != nil || !reflect.DeepEqual(again, kv) {
			t.Fatalf("ParseArgs(%q) = %v; joined again it reads %v, %v", args, kv, again, err)
		}

		ips, err := StaticIPs(conf, args)
		if err != nil {
			checkSpecError(t, "StaticIPs", err)
			return
		}
		var v4, v6 int
		for _, a := range ips {
			if !a.IsValid() || a.Is4In6() {
				t.Fatalf("StaticIPs(%q) gave %v", args, a)
			}
			if a.Is4() {
				v4++
			} else {
				v6++
			}
			if !containsAddr(kv["IP"], a) {
				t.Fatalf("StaticIPs(%q) gave %v, not in IP=%q", args, a, kv["IP"])
			}
		}
		if v4 > 1 || v6 > 1 {
			t.Fatalf("StaticIPs(%q) gave %v: more than one address of a family", args, ips)
		}
	})
}

// containsAddr reports whether one of the comma-separated entries of list
// (an address, or an address with a prefix length) is a.
func containsAddr(list string, a netip.Addr) bool {
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Unmap() == a {
			return true
		}
		if b, err := netip.ParseAddr(s); err == nil && b.Unmap() == a {
			return true
		}
	}
	return false
}

func checkSpecError(t *testing.T, what string, err error) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) || e.Code == 0 || e.Msg == "" {
		t.Fatalf("%s: %#v: want a spec error with a code and a message", what, err)
	}
}

// normalized returns c with empty slices and maps made nil, in c and in
// the structures it points to (prevResult's too, in place): JSON does not
// tell `[]` from a field that omitempty leaves out.
func normalized(c *NetConf) *NetConf {
	cp := *c
	nilEmpty(reflect.ValueOf(&cp).Elem())
	return &cp
}

func nilEmpty(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			nilEmpty(v.Elem())
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				nilEmpty(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 && v.CanSet() {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if v.Kind() == reflect.Slice {
			for i := 0; i < v.Len(); i++ {
				nilEmpty(v.Index(i))
			}
		}
	}
}
