// Command dhcp6c is the DHCPv6 client of test/kubelet's VM guest (Debian's
// busybox has no udhcpc6): it takes one lease on an interface with
// insomniacslk/dhcp's nclient6 (Solicit, Advertise, Request, Reply) and
// prints the address it was given, nothing else. The guest's init adds it
// (a /128; the on-link prefix and default route come from the router
// advertisements, as skein-vm serves them).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6/nclient6"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dhcp6c IFACE")
		os.Exit(2)
	}
	if err := lease(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "dhcp6c:", err)
		os.Exit(1)
	}
}

func lease(iface string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		// Until the link-local address has passed DAD it cannot be bound.
		c, err := nclient6.New(iface, nclient6.WithTimeout(2*time.Second), nclient6.WithRetry(2))
		if err != nil {
			last = err
			time.Sleep(500 * time.Millisecond)
			continue
		}
		adv, err := c.Solicit(ctx)
		if err == nil {
			var reply, err2 = c.Request(ctx, adv)
			if err2 == nil {
				c.Close()
				ia := reply.Options.OneIANA()
				if ia == nil || ia.Options.OneAddress() == nil {
					return fmt.Errorf("the reply has no address: %s", reply.Summary())
				}
				fmt.Println(ia.Options.OneAddress().IPv6Addr)
				return nil
			}
			err = err2
		}
		c.Close()
		last = err
	}
	return fmt.Errorf("no lease within 40s: %v", last)
}
