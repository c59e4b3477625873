# Conformance suite (test/conformance): real runtimes and clients driving
# skein — podman (CNI backend), containerd's ctr, cnitool — and iptables for
# the reference portmap plugin chained after skein.
pkgs+=(
  podman            # 4.3, run with its CNI backend and private storage
  containerd        # 1.6: containerd, ctr, containerd-shim-runc-v2
  runc              # the OCI runtime both use (crun refuses hybrid cgroups)
  conmon            # podman's container monitor
  iptables          # portmap (iptables-nft; used only inside test namespaces)
  busybox-static    # the containers' userland (image built by the tests)
  kmod              # modprobe: the bandwidth chain loads ifb without host devices
)

# post installs the upstream cnitool, pinned, into a cache outside the
# repository: ${SKEIN_TOOLS:-$HOME/.cache/skein/tools}/cni-v1.3.1/cnitool.
post() {
  local dir="${SKEIN_TOOLS:-$HOME/.cache/skein/tools}/cni-v1.3.1"
  [ -x "$dir/cnitool" ] && return 0
  local go="${GO:-go}"
  command -v "$go" >/dev/null || go=/usr/local/go/bin/go
  echo "install-deps: conformance: go install cnitool@v1.3.1 into $dir"
  mkdir -p "$dir"
  GOBIN="$dir" GOFLAGS= "$go" install github.com/containernetworking/cni/cnitool@v1.3.1
}
