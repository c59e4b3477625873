#!/usr/bin/env bash
# make cluster / make cluster-down: a local Kubernetes cluster with skein
# installed, for a person. Two nodes (each a network namespace with its own
# containerd, kubelet and kube-proxy) and a control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler) in another,
# joined by a bridge there; nothing on the host's own network. It is
# test/kubelet's TestLocalCluster, held in the background until
# `make cluster-down`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SKEIN_CLUSTER_DIR:-/run/skein-cluster}
bin=${BIN:-$PWD/bin}

up() {
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "cluster: already up (pid $(cat "$dir/pid")); make cluster-down first" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  go test -c -o "$dir/kubelet.test" ./test/kubelet
  (
    cd test/kubelet
    SKEIN_BIN_DIR="$bin" SKEIN_CLUSTER_HOLD="$dir" setsid "$dir/kubelet.test" \
      -test.run '^TestLocalCluster$' -test.timeout 0 -test.v >"$dir/cluster.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
  )
  local pid
  pid=$(cat "$dir/pid")
  echo "cluster: starting (log: $dir/cluster.log) ..."
  local start=$SECONDS
  until [ -f "$dir/ready" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "cluster: failed to come up; the end of its log:" >&2
      tail -n 40 "$dir/cluster.log" >&2
      exit 1
    fi
    if [ $((SECONDS - start)) -gt 600 ]; then
      echo "cluster: not ready after 10 minutes; see $dir/cluster.log; make cluster-down removes it" >&2
      exit 1
    fi
    sleep 1
  done
  cat <<MSG
cluster: up in $((SECONDS - start)) s: two nodes running skein (kubectl apply -k of
deploy/kubernetes), the AddressPool "default" (10.244.0.0/24, fd00:244::/120).

  $dir/kubectl get nodes -o wide
  $dir/kubectl -n skein-system get pods -o wide
  $dir/kubectl run demo --image=skein.test/busybox:1 -- sleep 3600
  $dir/kubectl get pods -o wide

Images on the nodes (nothing is pulled): skein:dev, skein.test/busybox:1,
skein.test/pause:1. The nodes' namespaces: $dir/nodes.
Tear it down with: make cluster-down
MSG
}

down() {
  if [ ! -f "$dir/pid" ]; then
    echo "cluster: not up"
    return 0
  fi
  local pid
  pid=$(cat "$dir/pid")
  touch "$dir/down"
  local i
  for i in $(seq 120); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "cluster: still up after 2 minutes; killing it" >&2
    kill -TERM "$pid" || true
    sleep 20
  fi
  grep -E -- '^(--- |FAIL|ok|PASS)' "$dir/cluster.log" | tail -n 3 || true
  rm -rf "$dir"
  echo "cluster: down"
}

case ${1:-} in
up) up ;;
down) down ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
