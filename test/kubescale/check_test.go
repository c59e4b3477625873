package kubescale

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// apiBlock is an AddressBlock as the API server holds it at the end.
type apiBlock struct {
	Name, Node string
	Prefixes   []netip.Prefix
}

func apiBlocks(list []skeinv1.AddressBlock) ([]apiBlock, error) {
	out := make([]apiBlock, 0, len(list))
	for _, b := range list {
		ab := apiBlock{Name: b.Name, Node: b.NodeName}
		for _, s := range []*string{b.IPv4, b.IPv6} {
			if s == nil {
				continue
			}
			p, err := netip.ParsePrefix(*s)
			if err != nil {
				return nil, fmt.Errorf("AddressBlock %s: %w", b.Name, err)
			}
			ab.Prefixes = append(ab.Prefixes, p)
		}
		out = append(out, ab)
	}
	return out, nil
}

// checkAddresses is the run's "never one address on two nodes": the
// blocks in the API do not overlap and each has an owner; no address was
// handed out twice (to two pods, on one node or two); and every address a
// node handed out lies in a block the API says is that node's. held maps
// each node to the addresses its pods got. It returns one line per
// problem (at most a few of each kind) and the number of addresses found
// on more than one pod.
func checkAddresses(blocks []apiBlock, held map[string][]netip.Addr) (problems []string, dups int) {
	const most = 5
	say := func(n *int, f string, a ...any) {
		if *n++; *n <= most {
			problems = append(problems, fmt.Sprintf(f, a...))
		}
	}
	var overlaps, orphans, dupLines, foreign int

	type span struct {
		p     netip.Prefix
		block string
	}
	var spans []span
	for _, b := range blocks {
		if b.Node == "" {
			say(&orphans, "block %s has no nodeName", b.Name)
		}
		for _, p := range b.Prefixes {
			spans = append(spans, span{p.Masked(), b.Name})
		}
	}
	// Sorted by start address, two prefixes overlap only if neighbours do
	// (prefixes nest or are disjoint).
	sort.Slice(spans, func(i, j int) bool {
		if c := spans[i].p.Addr().Compare(spans[j].p.Addr()); c != 0 {
			return c < 0
		}
		return spans[i].p.Bits() < spans[j].p.Bits()
	})
	for i := 1; i < len(spans); i++ {
		if spans[i-1].p.Overlaps(spans[i].p) {
			say(&overlaps, "blocks %s (%v) and %s (%v) overlap", spans[i-1].block, spans[i-1].p, spans[i].block, spans[i].p)
		}
	}

	owner := map[netip.Prefix]string{}
	for _, b := range blocks {
		for _, p := range b.Prefixes {
			owner[p.Masked()] = b.Node
		}
	}
	bits := map[int]bool{}
	for p := range owner {
		bits[p.Bits()] = true
	}
	seen := map[netip.Addr]string{}
	names := make([]string, 0, len(held))
	for n := range held {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, a := range held[n] {
			if other, ok := seen[a]; ok {
				dups++
				say(&dupLines, "%v handed out twice: on %s and on %s", a, other, n)
				continue
			}
			seen[a] = n
			in := ""
			for b := range bits {
				p, _ := a.Prefix(b)
				if o, ok := owner[p]; ok {
					in = o
					break
				}
			}
			if in != n {
				say(&foreign, "%v is on node %s but its block is %q's in the API", a, n, in)
			}
		}
	}
	for _, c := range []struct {
		n    int
		what string
	}{{overlaps, "overlapping blocks"}, {orphans, "blocks without an owner"}, {dupLines, "addresses handed out twice"}, {foreign, "addresses outside their node's blocks"}} {
		if c.n > most {
			problems = append(problems, fmt.Sprintf("... %d %s in all", c.n, c.what))
		}
	}
	return problems, dups
}

// checkOwned compares what each node's Manager holds (its OwnedBlocks)
// with the blocks the API says are its own: a block the API gives a node
// that the node does not use is leaked; one the node uses that the API
// gives to nobody (or another) is the start of a duplicate.
func checkOwned(blocks []apiBlock, owned map[string][]netip.Prefix) []string {
	api := map[string][]string{}
	for _, b := range blocks {
		for _, p := range b.Prefixes {
			api[b.Node] = append(api[b.Node], p.Masked().String())
		}
	}
	var problems []string
	for n, ps := range owned {
		var mine []string
		for _, p := range ps {
			mine = append(mine, p.Masked().String())
		}
		slices.Sort(mine)
		theirs := slices.Sorted(slices.Values(api[n]))
		if !slices.Equal(mine, theirs) && len(problems) < 5 {
			problems = append(problems, fmt.Sprintf("node %s holds blocks [%s], the API gives it [%s]", n,
				strings.Join(mine, " "), strings.Join(theirs, " ")))
		}
	}
	return problems
}
