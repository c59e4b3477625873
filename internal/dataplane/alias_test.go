package dataplane

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAttachmentAlias(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	prefix64 := "p" + long("x", 62) + ":"
	tests := []struct {
		name                   string
		prefix, net, ctr, ifn  string
		wantExact              string // "" = not checked
		wantNet, wantCtrPrefix string // the fields kept (beginning of the container ID)
	}{
		{name: "short", prefix: "skein:", net: "net", ctr: "c1", ifn: "eth0", wantExact: "skein:net:c1:eth0"},
		{name: "docker", prefix: "skein:", net: "docker:" + long("a", 64), ctr: long("b", 64), ifn: "eth",
			wantExact: "skein:docker:" + long("a", 64) + ":" + long("b", 64) + ":eth"},
		{name: "CNI container ID of 256 bytes", prefix: "skein:", net: "net", ctr: long("c", 256), ifn: "eth0", wantNet: "net", wantCtrPrefix: long("c", 100)},
		{name: "both long", prefix: "skein:", net: "docker:" + long("n", 300), ctr: long("e", 300), ifn: "eth", wantCtrPrefix: long("e", 100)},
		{name: "longest prefix and ifname", prefix: prefix64, net: long("n", 63), ctr: long("c", 256), ifn: long("i", 15), wantNet: long("n", 63)},
		{name: "multi-byte runes", prefix: "skein:", net: "net", ctr: long("é", 200), ifn: "eth0", wantNet: "net"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AttachmentAlias(tt.prefix, tt.net, tt.ctr, tt.ifn)
			if len(got) > MaxAliasLen || !utf8.ValidString(got) || !strings.HasPrefix(got, tt.prefix) {
				t.Fatalf("alias %q: %d bytes (max %d), valid UTF-8 %v", got, len(got), MaxAliasLen, utf8.ValidString(got))
			}
			if tt.wantExact != "" && got != tt.wantExact {
				t.Fatalf("alias %q, want %q", got, tt.wantExact)
			}
			// Parseable: the last two colons split it into the fields.
			rest := strings.TrimPrefix(got, tt.prefix)
			i := strings.LastIndex(rest, ":")
			j := strings.LastIndex(rest[:i], ":")
			net, ctr, ifn := rest[:j], rest[j+1:i], rest[i+1:]
			if ifn != tt.ifn {
				t.Errorf("ifname field %q, want %q", ifn, tt.ifn)
			}
			if tt.wantNet != "" && net != tt.wantNet {
				t.Errorf("network field %q, want %q", net, tt.wantNet)
			}
			if !strings.HasPrefix(ctr, tt.wantCtrPrefix) {
				t.Errorf("container field %q lost the beginning %q", ctr, tt.wantCtrPrefix)
			}
			if ctr != tt.ctr && !strings.Contains(ctr, "~") {
				t.Errorf("shortened container field %q has no hash mark", ctr)
			}
			// IDs that differ only at the end still give different tags.
			if other := AttachmentAlias(tt.prefix, tt.net, tt.ctr[:len(tt.ctr)-1]+"Z", tt.ifn); other == got {
				t.Errorf("two container IDs gave the same alias %q", got)
			}
		})
	}
}
