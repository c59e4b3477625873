# VM front door (skein-vm): real DHCP clients, dnsmasq (the benchmark's
# contender), qemu and a Debian kernel for the VM test. The demo (profile
# "demo") needs qemu, the kernel, busybox and dhclient (the guest's DHCPv6
# client) only.
if [ "${profile:-all}" = demo ]; then
  pkgs+=(qemu-system-x86 busybox-static isc-dhcp-client)
else
  pkgs+=(
    udhcpc            # busybox DHCP client
    isc-dhcp-client   # dhclient
    dhcpcd-base       # dhcpcd
    dnsmasq-base      # DHCP benchmark contender: the binary only, no system service
    qemu-system-x86   # the real VM, under TCG
    busybox-static    # the VM's initramfs userland
    xz-utils          # test/guest unpacks the kernel once (a compressed one boots seconds slower under TCG)
  )
fi

# post downloads the Debian kernel that linux-image-amd64 points at and
# extracts it under SKEIN_KERNEL_CACHE (default /var/cache/skein/kernel),
# outside the repository: <cache>/<version>/boot/vmlinuz-* and
# <cache>/<version>/lib/modules/. A "current" symlink names the version the
# tests use. Nothing is installed on the host; when the version is cached
# this costs one apt-cache call.
post() {
  local cache="${SKEIN_KERNEL_CACHE:-/var/cache/skein/kernel}"
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$pkg" ]; then
    # No package lists yet (nothing else needed installing): fetch them.
    apt-get update -qq
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  if [ -z "$pkg" ]; then
    echo "install-deps: vm: cannot resolve linux-image-amd64 (apt-get update?)" >&2
    return 1
  fi
  local ver=${pkg#linux-image-}
  if [ -e "$cache/$ver/.done" ]; then
    ln -sfn "$ver" "$cache/current"
    return 0
  fi
  echo "install-deps: vm: fetching $pkg into $cache/$ver"
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.dl.XXXXXX")
  # apt-get download drops privileges to _apt, which must be able to write
  # there (else it warns and downloads as root).
  chown _apt "$tmp" 2>/dev/null || chmod 0777 "$tmp"
  (cd "$tmp" && apt-get download -qq "$pkg" >/dev/null) || { rm -rf "$tmp"; return 1; }
  rm -rf "${cache:?}/$ver"
  mkdir -p "$cache/$ver"
  dpkg-deb -x "$tmp"/*.deb "$cache/$ver" || { rm -rf "$tmp" "${cache:?}/$ver"; return 1; }
  rm -rf "$tmp"
  touch "$cache/$ver/.done"
  ln -sfn "$ver" "$cache/current"
}
