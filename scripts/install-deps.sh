#!/usr/bin/env bash
# Installs what skein's tests, demo and benchmarks need on a Debian machine
# (CI starts from a fresh one). Idempotent: it installs only what is missing.
# Each front door keeps its own needs in scripts/deps.d/*.sh, which may
# append to the `pkgs` array and define a `post` step (run after apt).
#
# Usage: install-deps.sh [all|demo]. "all" (the default, `make test`) is
# everything; "demo" (`make demo`) is only what test/demo runs: ping, Docker
# (docker.sh) and qemu with the cached kernel (vm.sh, which reads $profile
# to leave out the DHCP clients and dnsmasq only the tests use).
set -euo pipefail
cd "$(dirname "$0")"

profile=${1:-all}
case "$profile" in
all)
  pkgs=(
    containernetworking-plugins # reference CNI plugins (chaining tests, benchmark contenders)
    iproute2                    # ip(8): the DHCP clients' scripts, ip netns exec for debugging
    iputils-ping                # reachability checks inside pod namespaces
    nftables
    gcc libc6-dev               # bin/skein is C, linked statically (make build)
  )
  files=(deps.d/*.sh)
  ;;
demo)
  pkgs=(iputils-ping gcc libc6-dev)
  files=(deps.d/docker.sh deps.d/vm.sh)
  ;;
*)
  echo "usage: $0 [all|demo]" >&2
  exit 2
  ;;
esac
posts=()
for f in "${files[@]}"; do
  [ -e "$f" ] || continue
  post() { :; }
  # shellcheck source=/dev/null
  . "$f"
  posts+=("$(declare -f post)")
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  # No package installed here may start a service on the host: docker.io's
  # dockerd would add its bridge and iptables rules (FORWARD DROP), and
  # `make test` checks that the host's network is as it was. While apt
  # runs, a policy-rc.d keeps invoke-rc.d and deb-systemd-invoke from
  # starting anything — unless the machine already has a policy.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# skein install-deps: no service starts while installing\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
for p in "${posts[@]}"; do
  eval "$p"
  post
done
