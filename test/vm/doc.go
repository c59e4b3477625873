// Package vm tests skein's VM front door end to end, as root, in throwaway
// namespaces: the skein-vm chained plugin driven through libcni after
// skein and after the reference bridge plugin, real DHCP clients (udhcpc,
// dhclient, dhcpcd) in a namespace standing in for the VM, a real VM
// (qemu under TCG, started by skein-vmwrapper with the tap descriptor),
// restart, bad input, and the DHCP lease benchmark against dnsmasq.
package vm
