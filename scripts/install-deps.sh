#!/usr/bin/env bash
# Installs what skein's tests, demo and benchmarks need on a Debian machine
# (CI starts from a fresh one). Idempotent: it installs only what is missing.
set -euo pipefail

pkgs=(
  containernetworking-plugins # reference CNI plugins (chaining tests, benchmark contenders)
  iproute2                    # ip netns exec for debugging; ss
  iputils-ping                # reachability checks inside pod namespaces
  nftables
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
