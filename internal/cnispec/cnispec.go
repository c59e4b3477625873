// Package cnispec holds the facts about the CNI specification that both
// skeind (internal/cni) and the plugin binaries (internal/cniplugin) need:
// which spec versions skein speaks. It imports nothing, so that the
// plugins, exec'd for every ADD and DEL, can use it without linking the
// CNI library's types.
package cnispec

// Versions are the spec versions skein accepts: every version the spec
// has had, oldest first. A configuration without cniVersion is 0.1.0, as
// the spec and libcni read it.
var Versions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Newest is the newest spec version, the one a VERSION answer names.
const Newest = "1.1.0"
