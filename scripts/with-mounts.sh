#!/bin/sh
# with-mounts.sh N COMMAND...: runs COMMAND in a mount namespace of its own
# (host mounts still propagate in, nothing propagates out) holding N more
# mounts than the host's, the way a busy node's mount table looks (kubelet
# volumes, overlay roots, netns pins). The benchmarks use it to measure
# what the host's mount count costs a sandboxed plugin call. The extra
# mounts are tmpfs under one tmpfs on a fresh temporary directory; they go
# with the namespace, and the directory is removed at the end.
set -eu
n=$1
shift
dir=$(mktemp -d /tmp/skein-mounts.XXXXXX)
trap 'rmdir "$dir"' EXIT
unshare --mount --propagation slave -- sh -eu -c '
	n=$1 dir=$2
	shift 2
	mount -t tmpfs -o size=1m skein-mounts "$dir"
	i=0
	while [ "$i" -lt "$n" ]; do
		mkdir "$dir/$i"
		mount -t tmpfs -o size=4k skein-mount "$dir/$i"
		i=$((i + 1))
	done
	echo "with-mounts: $(wc -l </proc/self/mountinfo) mounts in this namespace" >&2
	exec "$@"
' with-mounts "$n" "$dir" "$@"
