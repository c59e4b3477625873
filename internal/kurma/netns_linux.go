package kurma

import (
	"github.com/skeinnet/skein/internal/netns"
)

func isNetNS(path string) error { return netns.IsNetNS(path) }

// linkNames lists the interface names in the namespace at path.
func linkNames(path string) ([]string, error) {
	h, done, err := netns.Handle(path)
	if err != nil {
		return nil, err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(links))
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	return out, nil
}
