// Package kurma tests pod networks end to end with the real binaries:
// skeind (with --node-netns and a podNetworks config), the skein CNI
// plugin in its meta mode driven through libcni, plugin images built by
// `skeinctl image pack-cni` from Debian's reference plugins and fetched
// from a file, an HTTP server on 127.0.0.1 and Debian's docker-registry.
// The benchmarks compare an image-backed network with the same plugin
// exec'd directly through libcni. Run as root.
package kurma
