package guest

// UdhcpcScript is the udhcpc script of a busybox VM guest (the qemu VMs of
// test/vm and test/kubelet): it configures the leased IPv4 address with
// its mask, the MTU option and the classless static routes (option 121,
// which skein-vm serves, including the on-link route to the gateway).
const UdhcpcScript = `#!/bin/sh
case "$1" in
deconfig) ip -4 addr flush dev "$interface" ;;
bound|renew)
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
	set -- $staticroutes
	while [ $# -ge 2 ]; do
		if [ "$2" = 0.0.0.0 ]; then ip route add "$1" dev "$interface"; else ip route add "$1" via "$2" dev "$interface"; fi
		shift 2
	done ;;
esac
exit 0
`
