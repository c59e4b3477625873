package kurma

import (
	"net"

	"github.com/skeinnet/skein/internal/netns"
)

func isNetNS(path string) error { return netns.IsNetNS(path) }

// linkNames lists the interface names in the namespace at path: one
// RTM_GETLINK dump from a socket made inside it (the standard library's,
// which decodes only names and flags: a third of the cost of a netlink
// handle and its full link decoding, on every attach's plan).
func linkNames(path string) ([]string, error) {
	var out []string
	err := netns.Do(path, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			out = append(out, i.Name)
		}
		return nil
	})
	return out, err
}
