package main

import (
	"testing"

	"github.com/skeinnet/skein/test/harness"
)

func TestAllow(t *testing.T) {
	self := "/run/netns type=ext4 source=/dev/vda root=/run/netns"
	other := "/tmp/x type=overlay source=overlay root=/"
	for _, c := range []struct {
		name        string
		before      []string
		added, gone []string
		wantDiffs   int
		wantNotes   int
	}{
		{"netns dir appears", nil, []string{self}, nil, 0, 1},
		{"netns dir and another mount appear", nil, []string{self, other}, nil, 1, 1},
		{"netns dir was there: a second one is not allowed", []string{self}, []string{self}, nil, 1, 0},
		{"a mount gone", nil, nil, []string{other}, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := harness.Host{Mounts: c.before}
			diffs, notes := allow(before, []harness.HostDiff{{What: "mounts", Added: c.added, Gone: c.gone}})
			if len(diffs) != c.wantDiffs || len(notes) != c.wantNotes {
				t.Errorf("allow: %d diffs %v, %d notes %v; want %d and %d", len(diffs), diffs, len(notes), notes, c.wantDiffs, c.wantNotes)
			}
		})
	}
	// Only mounts: a new link is never allowed.
	diffs, _ := allow(harness.Host{}, []harness.HostDiff{{What: "links", Added: []string{self}}})
	if len(diffs) != 1 {
		t.Errorf("a link diff was allowed: %v", diffs)
	}
}
