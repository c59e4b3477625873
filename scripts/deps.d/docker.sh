# Docker front door: its tests drive a real Docker engine (Debian's
# docker.io, 20.10) started by the test inside a node namespace, and import
# a busybox image (the static build: the image has no libraries).
pkgs+=(docker.io busybox-static)

# Installing docker.io must not start a dockerd on the host: its default
# bridge and iptables rules (FORWARD DROP) would change the host's network.
# While apt runs, a policy-rc.d keeps invoke-rc.d and deb-systemd-invoke
# from starting services — unless the machine already has a policy.
if ! dpkg-query -W -f='${Status}' docker.io 2>/dev/null | grep -q "install ok installed" &&
  [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\n# skein install-deps: no service starts while installing\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  skein_docker_policy=1
fi

post() {
  if [ "${skein_docker_policy:-}" = 1 ]; then
    rm -f /usr/sbin/policy-rc.d
  fi
  # The tests discover plugins here; dockerd creates it too, but only once
  # it runs.
  mkdir -p /run/docker/plugins
}
