# Routing between nodes (internal/routing, test/e2e): the export mode is
# proven with real BIRD 2 exchanging the exported block routes over BGP
# between node namespaces. Its service never starts (install-deps.sh keeps
# services from starting); the tests run `bird -f` inside their namespaces.
pkgs+=(
  bird2
)
