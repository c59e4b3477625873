package image

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		src     Source
		scheme  Scheme
		target  string // Path, URL or Name
		pinned  bool
		wantErr string
	}{
		{src: Source{Image: "file:///var/lib/p.aci"}, scheme: SchemeFile, target: "/var/lib/p.aci"},
		{src: Source{Image: "file://localhost/var/lib/p.aci", Digest: d}, scheme: SchemeFile, target: "/var/lib/p.aci", pinned: true},
		{src: Source{Image: "file:///var/lib/../p"}, scheme: SchemeFile, target: "/var/p"},
		{src: Source{Image: "file://p.aci"}, wantErr: "local absolute path"},
		{src: Source{Image: "file:///"}, wantErr: "absolute file path"},
		{src: Source{Image: "file:///p?x=1"}, wantErr: "no query"},
		{src: Source{Image: "https://example.com/p.aci", Digest: d}, scheme: SchemeHTTP, target: "https://example.com/p.aci", pinned: true},
		{src: Source{Image: "http://127.0.0.1:8080/p.tar", Digest: d}, scheme: SchemeHTTP, target: "http://127.0.0.1:8080/p.tar", pinned: true},
		{src: Source{Image: "https://example.com/p.aci"}, wantErr: "needs a digest"},
		{src: Source{Image: "https:///p.aci", Digest: d}, wantErr: "no host"},
		{src: Source{Image: "docker://127.0.0.1:5000/skein/p@" + d}, scheme: SchemeDocker, target: "127.0.0.1:5000/skein/p@" + d, pinned: true},
		{src: Source{Image: "docker://registry.example/pl:1", Digest: d}, scheme: SchemeDocker, target: "registry.example/pl@" + d, pinned: true},
		{src: Source{Image: "docker://registry.example/pl:1", AllowTags: true}, scheme: SchemeDocker, target: "registry.example/pl:1"},
		{src: Source{Image: "docker:///user/plugin:1", AllowTags: true}, scheme: SchemeDocker, target: "index.docker.io/user/plugin:1"},
		{src: Source{Image: "docker://user/plugin"}, wantErr: "not pinned"},
		{src: Source{Image: "docker://registry.example/pl:1"}, wantErr: "not pinned"},
		{src: Source{Image: "docker://"}, wantErr: "no repository"},
		{src: Source{Image: "docker://Bad Name"}, wantErr: "could not parse"},
		{src: Source{Image: "docker://r.example/pl@" + d, Digest: "sha256:" + strings.Repeat("cd", 32)}, wantErr: "differs"},
		{src: Source{Image: "docker://r.example/pl", Digest: "sha512:" + strings.Repeat("cd", 64)}, wantErr: "unsupported hash"},
		{src: Source{Image: "docker://r.example/pl", Digest: "sha256:" + strings.Repeat("AB", 32)}, wantErr: "non-hex"},
		{src: Source{Image: "docker://r.example/pl", Digest: "sha256:abc"}, wantErr: "parse digest"},
		{src: Source{Image: "apcera.com/kurma/cni-netplugin"}, wantErr: "no scheme"},
		{src: Source{Image: "ftp://x/p"}, wantErr: "unknown scheme"},
	}
	for _, c := range cases {
		ref, err := Parse(c.src)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%+v: error %v, want one with %q", c.src, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c.src, err)
			continue
		}
		var target string
		switch ref.Scheme {
		case SchemeFile:
			target = ref.Path
		case SchemeHTTP:
			target = ref.URL
		case SchemeDocker:
			target = ref.Name.Name()
		}
		if ref.Scheme != c.scheme || target != c.target || ref.Pinned() != c.pinned {
			t.Errorf("%+v: got %s %q pinned=%v, want %s %q pinned=%v", c.src, ref.Scheme, target, ref.Pinned(), c.scheme, c.target, c.pinned)
		}
	}
}
