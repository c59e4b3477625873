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
#      long each took.
#
# Exits non-zero if either run fails; their logs stay under the temporary
# directory it prints. Refuses to start while tests run on this machine.
#
# Usage: scripts/fresh-check.sh [--dry-run | --clean-only]
#   --dry-run     list what the cleanup would remove, and stop
#   --clean-only  do the cleanup, and stop
set -euo pipefail

mode=full
case "${1:-}" in
"") ;;
--dry-run) mode=dry ;;
--clean-only) mode=clean ;;
*)
  echo "usage: $0 [--dry-run | --clean-only]" >&2
  exit 2
  ;;
esac
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

status=0
summary=()
for run in demo 1 2; do
  target=test
  [ "$run" = demo ] && target=demo
  log=$work/make-$target-$run.log
  "$go" run ./test/hostcheck clean >/dev/null
  echo "== make $target, run $run (log: $log)"
  start=$(date +%s)
  if make -C "$work/skein" "$target" >"$log" 2>&1; then rc=0; else rc=$?; fi
  secs=$(($(date +%s) - start))
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
