# Benchmark (make bench, cmd/skein-bench): iperf3 for the data path; the
# contenders bridge, ptp and host-local come with containernetworking-plugins.
pkgs+=(
  iperf3            # pod-to-pod TCP throughput (started inside test namespaces only)
)
