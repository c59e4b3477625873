#!/usr/bin/env bash
# fresh-check.sh — prove that `make test` passes on this machine every time,
# not only the second time. As root:
#
#   1. removes the test bed state skein's tests may leave behind
#      (`go run ./test/hostcheck clean`: orphaned test processes, skein-*
#      namespaces and pins hidden under /run/netns, the tests' dockerd,
#      podman and containerd roots, plugin sockets, cnitool's and podman's
#      cached results, dhcpcd leases) and unmounts /run/netns from itself
#      when nothing is pinned there, as on a machine that never ran
#      podman or `ip netns add`. Kept: installed packages and the caches
#      (/var/cache/skein, ~/.cache/skein, Go's build and module caches);
#   2. clones this checkout's HEAD (committed work only) into a temporary
#      directory;
#   3. runs `make demo` there, then `make test` twice in a row (each ends
#      with the host check), each after the cleanup of step 1 again, so each
#      meets what a machine where Docker, containerd, podman and cnitool
#      never ran lacks (their first-run files, /run/netns), and prints how
#      long each took;
#   4. before each run, makes absent what a brand-new machine does not have
#      (a warm developer machine hid both from the checks before): the
#      first-run state of Docker, containerd and CNI (FIRST_RUN_PATHS below:
#      moved aside into the temporary directory, and put back afterwards —
#      a run that leaves any of them behind fails; DEPS_PATHS, which
#      `make deps` makes on purpose, are moved aside too), and the nftables
#      package (`apt-get remove`, so that the run's own `make deps` must
#      install it; installed again at the end if the run did not).
#
# Exits non-zero if either run fails; their logs stay under the temporary
# directory it prints. Refuses to start while tests run on this machine.
#
# Usage: scripts/fresh-check.sh [--dry-run | --clean-only | --runs LIST]
#   --dry-run     list what the cleanup would remove, and stop
#   --clean-only  do the cleanup, and stop
#   --runs LIST   the runs to make, space-separated (default "demo 1 2":
#                 demo is `make demo`, anything else a `make test`)
set -euo pipefail

mode=full
runs="demo 1 2"
case "${1:-}" in
"") ;;
--dry-run) mode=dry ;;
--clean-only) mode=clean ;;
--runs) runs=${2:?--runs needs a list} ;;
*)
  echo "usage: $0 [--dry-run | --clean-only | --runs LIST]" >&2
  exit 2
  ;;
esac

# What a machine where Docker, containerd and no CNI plugin ever ran does
# not have, and which their first start writes (dockerd's trust key,
# containerd's shim directory, the CNI result cache, ...).
FIRST_RUN_PATHS=(/etc/docker/key.json /var/lib/docker /var/lib/containerd
  /run/containerd /var/lib/cni /run/skein)
# Made absent too, but `make deps` creates them on purpose (the plugin
# directory dockerd would make at its first start): a run may leave them.
DEPS_PATHS=(/run/docker)
if [ "$(id -u)" != 0 ]; then
  echo "fresh-check: run as root (the tests create namespaces)" >&2
  exit 1
fi
root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cd "$root"
go=${GO:-go}
command -v "$go" >/dev/null || go=/usr/local/go/bin/go
export PATH=$PATH:$(dirname "$(command -v "$go")")

echo "== fresh-check: cleaning skein's test bed state on $(hostname) ($(nproc) cores, kernel $(uname -r))"
if [ "$mode" = dry ]; then
  "$go" run ./test/hostcheck clean -n
  exit 0
fi
"$go" run ./test/hostcheck clean
[ "$mode" = clean ] && exit 0

head=$(git rev-parse HEAD)
work=$(mktemp -d /tmp/skein-fresh.XXXXXX)
if ! git diff --quiet HEAD; then
  echo "fresh-check: note: uncommitted changes are not part of the check (HEAD $head)"
fi
echo "== cloning $head into $work/skein"
git clone -q --no-hardlinks "$root" "$work/skein"
git -C "$work/skein" checkout -q --detach "$head"

# first_run_absent moves FIRST_RUN_PATHS aside into $aside and removes the
# nftables package; first_run_back puts them back (failing when the run
# made any of them anew) and reinstalls nftables if the run did not.
aside=$work/aside
had_nft=no
first_run_absent() {
  mkdir -p "$aside"
  for p in "${FIRST_RUN_PATHS[@]}" "${DEPS_PATHS[@]}"; do
    if [ -e "$p" ]; then
      mkdir -p "$aside$(dirname "$p")"
      mv "$p" "$aside$p"
      echo "   made absent: $p"
    fi
  done
  if dpkg-query -W -f='${Status}' nftables 2>/dev/null | grep -q 'install ok installed'; then
    had_nft=yes
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq nftables >/dev/null
    echo "   made absent: the nftables package"
  fi
}
first_run_back() {
  local left=()
  for p in "${FIRST_RUN_PATHS[@]}"; do
    if [ -e "$aside$p" ]; then
      [ -e "$p" ] && left+=("$p") && rm -rf "$p"
      mv "$aside$p" "$p"
    elif [ -e "$p" ]; then
      left+=("$p")
    fi
  done
  for p in "${DEPS_PATHS[@]}"; do
    if [ -e "$aside$p" ]; then
      rm -rf "$p"
      mv "$aside$p" "$p"
    fi
  done
  if [ $had_nft = yes ] && ! command -v nft >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null
  fi
  if [ ${#left[@]} -gt 0 ]; then
    echo "   FAILED: the run left first-run state on the host: ${left[*]}"
    return 1
  fi
}
trap 'first_run_back >/dev/null 2>&1 || true' EXIT

status=0
summary=()
for run in $runs; do
  target=test
  [ "$run" = demo ] && target=demo
  log=$work/make-$target-$run.log
  "$go" run ./test/hostcheck clean >/dev/null
  first_run_absent
  echo "== make $target, run $run (log: $log)"
  start=$(date +%s)
  if make -C "$work/skein" "$target" >"$log" 2>&1; then rc=0; else rc=$?; fi
  secs=$(($(date +%s) - start))
  if ! first_run_back && [ $rc = 0 ]; then rc=1; fi
  tail -n 3 "$log" | sed 's/^/   /'
  if [ $rc = 0 ]; then result=passed; else
    result="FAILED (exit $rc)"
    status=1
    grep -E '^(--- FAIL|FAIL|hostcheck:|demo: FAILED)' "$log" | head -n 20 | sed 's/^/   /' || true
  fi
  summary+=("make $target ($run): $result in $((secs / 60))m$((secs % 60))s")
done

echo "== fresh-check summary ($head)"
printf '   %s\n' "${summary[@]}"
if [ $status = 0 ]; then
  rm -rf "$work"
  echo "== every run passed; the host is as it was"
else
  echo "== logs kept in $work"
fi
exit $status
