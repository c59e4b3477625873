package netns

import "testing"

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		"/run/netns":         "/run/netns",
		`/tmp/a\040b`:        "/tmp/a b",
		`/x\011y\012z\134`:   "/x\ty\nz\\",
		`/trailing\04`:       `/trailing\04`, // too short: kept as is
		`/not\999octal`:      `/not\999octal`,
		`\040\040`:           "  ",
		`/mixed\040and\134n`: `/mixed and\n`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountTable(t *testing.T) {
	table, err := MountTable()
	if err != nil {
		t.Fatal(err)
	}
	root := false
	for _, m := range table {
		if m.Point == "" || m.FSType == "" {
			t.Errorf("incomplete entry %+v", m)
		}
		root = root || m.Point == "/"
	}
	if !root {
		t.Errorf("no mount at / in %d entries", len(table))
	}
}
