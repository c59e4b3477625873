# Docker front door: its tests drive a real Docker engine (Debian's
# docker.io, 20.10) started by the test inside a node namespace, and import
# a busybox image (the static build: the image has no libraries).
pkgs+=(docker.io busybox-static)

# Installing docker.io must not start a dockerd on the host (its bridge and
# iptables rules would change the host's network): install-deps.sh keeps
# every service from starting while apt runs.

post() {
  # The tests discover plugins here; dockerd creates it too, but only once
  # it runs.
  mkdir -p /run/docker/plugins
}
