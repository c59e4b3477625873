package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The seed corpus under testdata/fuzz/FuzzConfig holds deploy/skeind.json
// (what the systemd unit reads), a configuration setting every field the
// README lists, and the smallest ones an operator writes.

// FuzzConfig: loadConfig never panics; it refuses with an error naming
// the file; a configuration it accepts is one JSON document, and it
// encodes and loads back to the same configuration.
func FuzzConfig(f *testing.F) {
	dir := f.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "skeind-fuzz-"); err == nil { // no disk writes per input
		dir = d
		f.Cleanup(func() { os.RemoveAll(d) })
	}
	path := filepath.Join(dir, "skeind.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig(path)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config file "+path+": ") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, which is not one JSON document", data)
		}
		enc, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("accepted configuration does not encode: %v", err)
		}
		if err := os.WriteFile(path, enc, 0o600); err != nil {
			t.Fatal(err)
		}
		back, err := loadConfig(path)
		if err != nil {
			t.Fatalf("encoded configuration %s is refused: %v", enc, err)
		}
		nilEmpty(reflect.ValueOf(&c).Elem())
		nilEmpty(reflect.ValueOf(&back).Elem())
		if !reflect.DeepEqual(c, back) {
			t.Fatalf("round trip changed the configuration:\n in: %s\nenc: %s\n%+v\n%+v", data, enc, c, back)
		}
	})
}

// nilEmpty makes empty slices and maps nil: JSON does not tell `[]` from a
// field that omitempty leaves out.
func nilEmpty(v reflect.Value) {
	switch v.Kind() {
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
