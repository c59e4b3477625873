// Package routebench is the benchmark of routing between nodes (issue 10):
// the data path of pods on different nodes against its baselines, and how
// fast a new AddressBlock's route reaches every other node, in one run on
// one machine.
//
//	go test -run '^$' -bench Routing -benchtime 1x -timeout 60m ./test/routebench/ \
//	    -args -out bench/out/routing
//
// BenchmarkRoutingDatapath: node namespaces joined by a veth underlay
// through a bridge namespace; real skeind binaries (--store kubernetes
// against a real kube-apiserver, --routing direct and vxlan) attach pods
// through the skein CNI plugin. TCP throughput (iperf3) and
// request/response latency (a blocking TCP ping-pong in this process,
// sockets made inside the namespaces) of the bare underlay, a kernel VXLAN
// pair made by hand, and pod to pod in direct and vxlan mode, the rows
// interleaved and each repeated, medians reported.
//
// BenchmarkRoutingConvergence: three real skeind nodes; time from an
// AddressBlock's creation through the API to its route in every other
// node's kernel (netlink route notifications), with the three nodes alone
// and with a thousand simulated nodes' blocks present; skeind's memory
// holding those routes.
//
// Both write results.json files and report.md under -out.
package routebench
