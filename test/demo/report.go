package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
)

func orDash(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

func (d *demo) printTable() {
	fmt.Println("\n== what each got (host link and pool from skeind's records)")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tIPV4\tIPV6\tHOST LINK\tPOOL\tINSIDE")
	for _, m := range d.members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.kind, m.name, orDash(m.v4), orDash(m.v6), m.hostLink, m.pool, m.detail)
	}
	tw.Flush()
}

// pingMatrix has every member ping every other one, in each family both
// have, prints the grid and fails if any echo went unanswered.
func (d *demo) pingMatrix(ctx context.Context) error {
	fmt.Println("\n== ping matrix: each row pings each column (4 = IPv4, 6 = IPv6; ✓ answered, ✗ did not)")
	results := make([]map[netip.Addr]bool, len(d.members))
	for i, from := range d.members {
		if from.ping == nil {
			continue
		}
		var to []netip.Addr
		for j, o := range d.members {
			if j == i {
				continue
			}
			if from.v4.IsValid() && o.v4.IsValid() {
				to = append(to, o.v4)
			}
			if from.v6.IsValid() && o.v6.IsValid() {
				to = append(to, o.v6)
			}
		}
		r, err := from.ping(ctx, to)
		if err != nil {
			return fmt.Errorf("ping from %s: %w", from.name, err)
		}
		results[i] = r
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
	head := []string{"from \\ to"}
	for _, m := range d.members {
		head = append(head, m.name)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	var failed []string
	for i, from := range d.members {
		row := []string{from.name}
		for j, to := range d.members {
			if i == j {
				row = append(row, "·")
				continue
			}
			var cell []string
			for _, fam := range []struct {
				label    string
				from, to netip.Addr
			}{{"4", from.v4, to.v4}, {"6", from.v6, to.v6}} {
				switch {
				case !fam.from.IsValid() || !fam.to.IsValid():
					cell = append(cell, fam.label+"-")
				case results[i] == nil:
					cell = append(cell, fam.label+"?")
				case results[i][fam.to]:
					cell = append(cell, fam.label+"✓")
				default:
					cell = append(cell, fam.label+"✗")
					failed = append(failed, fmt.Sprintf("%s → %s (%s)", from.name, to.name, fam.to))
				}
			}
			row = append(row, strings.Join(cell, " "))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	if len(failed) > 0 {
		return fmt.Errorf("%d ping(s) unanswered: %s", len(failed), strings.Join(failed, ", "))
	}
	n := 0
	for _, r := range results {
		n += len(r)
	}
	fmt.Printf("   all %d pings answered\n", n)
	return nil
}
