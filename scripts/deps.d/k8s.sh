# Kubernetes mode (api/v1alpha1, test/kube): its tests run a real
# kube-apiserver and etcd. Neither has a Debian package nor a download we can
# reach, so post builds them from the Go module proxy — kube-apiserver and
# kubectl from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server — in a
# scratch module outside the repository, and caches the binaries in a
# versioned directory: ${SKEIN_KUBE_ASSETS:-$HOME/.cache/skein/k8s-v1.35.4-etcd-v3.6.5}
# (test/kube reads the same variable and default). kube-controller-manager
# (only its garbage collector is run, by the tests that delete an owner) is
# a separate step with its own check, so a cache made before it was added
# gains it without the other three being rebuilt. The node binaries —
# kubelet, kube-proxy and kube-scheduler, for test/kubelet's real nodes and
# `make cluster` — are a third step of their own for the same reason. When
# every binary is there this costs nothing; a cold build takes minutes and
# ~2 GB of RAM at link time. The demo needs none of it.

post() {
  [ "${profile:-all}" = all ] || return 0
  local k8s=v1.35.4 etcd=v3.6.5
  local dir="${SKEIN_KUBE_ASSETS:-$HOME/.cache/skein/k8s-$k8s-etcd-$etcd}"
  local core=(kube-apiserver etcd kubectl) kcm=kube-controller-manager
  local node=(kubelet kube-proxy kube-scheduler)
  _k8s_have "$dir" "${core[@]}" "$kcm" "${node[@]}" && return 0
  local go="${GO:-go}"
  command -v "$go" >/dev/null || go=/usr/local/go/bin/go
  mkdir -p "$dir"
  # One build at a time: two `make test` runs on a cold cache would both
  # link (and the second would find half-written files without the lock).
  (
    flock 9
    local tmp
    tmp=$(mktemp -d "$dir/.build.XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT
    if ! _k8s_have "$dir" "${core[@]}"; then
      echo "install-deps: k8s: building kube-apiserver, kubectl $k8s and etcd $etcd into $dir (minutes, once)"
      _k8s_build "$go" "$k8s" "$etcd" "$tmp/core" k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3 || exit 1
      # The build names etcd's binary after its package directory (server).
      mv "$tmp/core/out/server" "$dir/etcd"
      mv "$tmp/core/out/kube-apiserver" "$tmp/core/out/kubectl" "$dir/"
    fi
    if ! _k8s_have "$dir" "$kcm"; then
      echo "install-deps: k8s: building $kcm $k8s into $dir (minutes, once)"
      _k8s_build "$go" "$k8s" "$etcd" "$tmp/kcm" "k8s.io/kubernetes/cmd/$kcm" || exit 1
      mv "$tmp/kcm/out/$kcm" "$dir/"
    fi
    if ! _k8s_have "$dir" "${node[@]}"; then
      echo "install-deps: k8s: building ${node[*]} $k8s into $dir (minutes, once)"
      _k8s_build "$go" "$k8s" "$etcd" "$tmp/node" k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler || exit 1
      mv "$tmp/node/out/kubelet" "$tmp/node/out/kube-proxy" "$tmp/node/out/kube-scheduler" "$dir/"
    fi
    echo "install-deps: k8s: done: $(ls "$dir" | tr '\n' ' ')"
  ) 9>"$dir/.lock"
}

# _k8s_have DIR NAME... is true when every NAME is an executable in DIR.
_k8s_have() {
  local dir=$1 n
  shift
  for n in "$@"; do
    [ -x "$dir/$n" ] || return 1
  done
}

# _k8s_build GO K8S ETCD TMP PKG... builds the commands PKG (packages of
# k8s.io/kubernetes at K8S or of etcd's server at ETCD) into TMP/out from a
# scratch module in TMP/mod. k8s.io/kubernetes points its staging modules
# (k8s.io/api, k8s.io/client-go, …) at ./staging with replace directives,
# which a dependent module does not see: the scratch module replaces each
# of them with its published twin, v0.<minor>.<patch> for v1.<minor>.<patch>.
_k8s_build() {
  local go=$1 k8s=$2 etcd=$3 tmp=$4
  shift 4
  local staging=v0.${k8s#v1.}
  mkdir -p "$tmp/mod" "$tmp/out"
  (
    cd "$tmp/mod" || exit 1
    export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0
    "$go" mod init skein.local/k8s-build >/dev/null 2>&1 || exit 1
    local gomod
    gomod=$("$go" mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [ -n "$gomod" ] || { echo "install-deps: k8s: cannot download k8s.io/kubernetes@$k8s" >&2; exit 1; }
    local m
    for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
      "$go" mod edit -replace "$m=$m@$staging" || exit 1
    done
    local pkg tools=()
    for pkg in "$@"; do
      case $pkg in
      go.etcd.io/*) tools+=("$pkg@$etcd") ;;
      *) tools+=("$pkg@$k8s") ;;
      esac
    done
    "$go" get -tool "${tools[@]}" || exit 1
    local minor=${k8s#v1.}
    minor=${minor%%.*}
    "$go" build -trimpath -o "$tmp/out/" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$k8s \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$minor \
      -X k8s.io/component-base/version.gitTreeState=clean" \
      "$@"
  )
}
