// Package kurma owns skein's pod networks in the Kurma style: the
// podNetworks configuration (parsed and validated here, every key it does
// not know passed through to the plugin unchanged), interface-name
// templates, the conversion of plugin results to CNI 1.1.0, and the
// Manager that attaches pods to networks and detaches them.
//
// # The configuration
//
// skeind's config file holds the list under "podNetworks" (or Kurma's
// documented "pod_networks"; not both); SIGHUP reloads it. The keys of an
// entry skein reads:
//
//	name                the network's name (letters, digits, _ . -; 1-63)
//	image               the plugin image (alias "aci"): file://, http(s)://
//	                    or docker:// (package image)
//	digest              sha256:… pinning the image (required for http(s))
//	allowTags           let a docker:// reference name a tag, unpinned
//	insecure            plain http to a non-loopback registry
//	type                the plugin type; "skein" without an image: a pool
//	pool                the pool of a "skein" network (default "default")
//	default             attach pods that ask for no networks
//	containerInterface  the interface name: a text/template with uuid,
//	                    shortuuid (8 characters), num (networks the pod
//	                    already has) and random N (N hex characters);
//	                    unique against the pod's existing interfaces and
//	                    the others of the same call
//	optional            a failed add is skipped and reported, not fatal
//	timeout             one add or del, "90s" or seconds (default 60 s)
//
// The whole entry, these keys and every other one, is the plugin's stdin,
// unchanged.
//
// # Networks
//
// A network is either an image (its /opt/network/add and del run in a
// sandbox, package sandbox, from the image cache, package image) or, when
// its type is "skein" and it names no image, one of skeind's own pools
// served through the daemon's normal attach path (Pools).
//
// # Records
//
// Every attachment is recorded in skeind's store (Meta bucket MetaKind)
// before its add runs (durably), and completed with the result after (in
// the store's volatile tier when it has one: see putCompletion). A pod has one
// PodRecord under its ID, or several under keys of the caller's
// (AttachRequest.Key: the CNI meta mode keeps one per CNI attachment),
// each detached on its own. A del always runs from the record: the same config bytes and image
// digest the add had, so it works after a restart of skeind and after the
// network left the config. Recover rolls back adds a crash interrupted;
// images are pruned when no record names them.
//
// # Order and failure
//
// A pod's networks are added in order and, when one fails, the ones this
// call added are deleted in reverse order; an optional network's failure
// is skipped and reported instead. Calls for one pod run one at a time;
// pods run in parallel under a cap (sandbox.Runner).
package kurma
