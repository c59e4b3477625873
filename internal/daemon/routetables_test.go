package daemon

import (
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/routing"
)

// TestCheckRoutingTables: in direct and vxlan mode the dataplane's tables
// must not be routing's table 120, and the pod table must be looked up
// before routing's rule (2001); export mode installs nothing of the sort.
func TestCheckRoutingTables(t *testing.T) {
	ok := dataplane.Config{PodTable: 116, ExportTable: 119, RulePriority: 2000}
	for _, c := range []struct {
		mode routing.Mode
		dp   dataplane.Config
		want string
	}{
		{routing.ModeVXLAN, ok, ""},
		{routing.ModeDirect, dataplane.Config{}, ""}, // the defaults, filled later
		{routing.ModeVXLAN, dataplane.Config{PodTable: 120, ExportTable: 119, RulePriority: 2000}, "--pod-table 120"},
		{routing.ModeDirect, dataplane.Config{PodTable: 116, ExportTable: 120, RulePriority: 2000}, "--export-table 120"},
		{routing.ModeVXLAN, dataplane.Config{PodTable: 116, ExportTable: 119, RulePriority: 2001}, "--rule-priority 2001"},
		{routing.ModeExport, dataplane.Config{PodTable: 120, ExportTable: 119, RulePriority: 3000}, ""},
	} {
		err := CheckRoutingTables(c.mode, c.dp)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.mode, c.dp, err, c.want)
		}
	}
}
