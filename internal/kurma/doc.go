// Package kurma owns skein's pod networks in the Kurma style: the
// podNetworks configuration (parsed and validated here, every key it does
// not know passed through to the plugin unchanged), interface-name
// templates, the conversion of plugin results to CNI 1.1.0, and the
// Manager that attaches pods to networks and detaches them.
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
// Every attachment is recorded in skeind's store (Meta bucket MetaKind,
// one PodRecord per pod) before its add runs, and completed with the result
// after. A del always runs from the record: the same config bytes and image
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
