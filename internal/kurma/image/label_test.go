package image

import (
	"slices"
	"testing"
)

// TestCNIPluginsLabel: only plain file names are taken from a pack-cni
// label; anything else voids the whole label (the image is then called
// through its /opt/network executables).
func TestCNIPluginsLabel(t *testing.T) {
	for label, want := range map[string][]string{
		"":                       nil,
		"ptp,host-local":         {"ptp", "host-local"},
		"ptp,../sh":              nil,
		"ptp,":                   nil,
		"a/b":                    nil,
		"..":                     nil,
		"bridge,host-local,v1.x": {"bridge", "host-local", "v1.x"},
	} {
		if got := cniPlugins(label); !slices.Equal(got, want) {
			t.Errorf("label %q: %q, want %q", label, got, want)
		}
	}
}
