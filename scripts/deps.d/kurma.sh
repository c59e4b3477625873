# Pod networks (internal/kurma, test/kurma): plugin images are pulled from a
# real OCI registry in the tests — Debian's docker-registry (distribution),
# run by each test on 127.0.0.1 with a config of its own; its service never
# starts (install-deps.sh keeps services from starting). The wrapped
# reference plugins come from containernetworking-plugins (install-deps.sh).
pkgs+=(
  docker-registry
)
