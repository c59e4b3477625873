// Package pack builds pod network images that wrap CNI plugins: the
// cni-netplugin idea of Kurma's document, so that any CNI plugin binary
// becomes a Kurma pod network skeind can run from an image.
//
// An image holds:
//
//	/opt/network/add     the shim (cmd/skein-netplugin), statically linked
//	/opt/network/del     a hard link to it (the shim picks ADD or DEL by name)
//	/opt/cni/bin/<name>  each given plugin (CNI_PATH for delegated IPAM)
//	/lib…, /lib64…       the loader and shared libraries a dynamically
//	                     linked plugin needs, found as the host's loader
//	                     would (DT_NEEDED, DT_RUNPATH, the default
//	                     directories), at the paths it will look in
//	/var/lib/cni         a link to /var/lib/network, the network's writable
//	                     state directory in a sandboxed call: host-local
//	                     and other plugins that keep state under
//	                     /var/lib/cni keep it per network and across calls
//
// and no main exec (nothing needs to run between calls).
//
// The image is reproducible: the same inputs give the same bytes (entries
// sorted, times zero, owners root, fixed compression), so its digest can
// be pinned in a config before it is built again elsewhere. Write emits a
// `docker save` archive, which internal/kurma/image reads from file:// and
// http(s)://; Build returns the image to push to a registry.
package pack
