// Command execfloor is skein-bench's exec floor: a static Go binary that
// answers every CNI ADD with the same canned result and does nothing else
// — no parsing, no call, no kernel work. What an ADD through it costs, exec'd
// by libcni exactly as skein is, is what running any Go plugin costs on the
// machine: libcni's own work, fork and exec, and the Go runtime's start-up.
// skein's own share of an ADD is skein's latency minus this floor minus the
// raw-netlink floor (the kernel work).
//
// It imports nothing but os, so that its start-up is the runtime's alone.
package main

import "os"

// result is a CNI 1.0.0 ADD result of the shape skein prints (host veth,
// container interface, one address, one default route).
const result = `{"cniVersion":"1.0.0","interfaces":[{"name":"sk000000000000","mac":"02:00:00:00:00:01"},` +
	`{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/run/netns/execfloor"}],` +
	`"ips":[{"interface":1,"address":"10.99.0.2/32","gateway":"169.254.1.1"}],` +
	`"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],"dns":{}}`

const versions = `{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}`

func main() {
	// Read the configuration as a plugin must (the runtime writes it to
	// stdin), and ignore it.
	var buf [16 << 10]byte
	for {
		n, err := os.Stdin.Read(buf[:])
		if n == 0 || err != nil {
			break
		}
	}
	switch os.Getenv("CNI_COMMAND") {
	case "ADD":
		os.Stdout.WriteString(result)
	case "VERSION":
		os.Stdout.WriteString(versions)
	}
}
