// Package vm is skein's VM front door, the Virtlet way: the skein-vm
// chained CNI plugin (thin, in cmd/skein-vm) sends each call here, and
// skeind turns the interfaces the main plugin made in a pod into VM
// networking, inside the pod's namespace:
//
//	VM ─ tap ─┐
//	          bridge ─ veth (the main plugin's; no address, new MAC) ─ node
//	DHCP ─────┘ (a goroutine in skeind, packet socket on the bridge)
//
// ADD, per interface of prevResult that is in the sandbox and has
// addresses: read what the veth carries (Inspect), record it, then
// (Plumb) strip its routes and addresses, give it a new MAC (the VM takes
// the one the result promised, so the node's neighbour entries stay
// right), make a tagged bridge and persistent tap with the veth's MTU,
// enslave both, bring everything up, install the nftables filter that
// keeps DHCP inside the pod, and start a Server serving exactly the
// result (Lease; Answer4/Answer6/RouterAdvert are pure). The tap's file
// descriptor reaches the VM launcher over the handover socket
// (package handover). DEL stops the server and undoes it all (Unplumb),
// idempotently. A restarted skeind serves again every recorded attachment
// whose tagged bridge is still in its pod.
//
// Files: conf.go (configuration, leases from a CNI result), dhcp4.go,
// dhcp6.go and frame.go (pure protocol logic), plumb_linux.go and
// nft_linux.go (the kernel), server_linux.go (DHCP serving) and
// ratelimit.go (the bound on answers a guest can provoke),
// fdserver_linux.go and token.go (tap handover), service.go (the gRPC
// service, records, restore).
package vm
