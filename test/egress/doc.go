// Package egress holds the end-to-end test of Egress gateways: a real
// kube-apiserver and skein-controller on the host, and inside a qemu guest
// (test/guest; this host's kernel has no fou, ipip or ip6tnl) the real
// skeind as the node, pods made through the skein CNI plugin, the real
// skein-egress in two router pods, kube-proxy's ClusterIP DNAT emulated
// with nftables, and an "external" network the client pod reaches through
// the gateway. See TestEgressCluster.
package egress
