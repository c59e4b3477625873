// Command hostcheck is the end of `make test`: it proves that the tests left
// the host as they found it. `hostcheck save FILE` records the host's
// network namespaces pinned (nsfs mounts and the names under /run/netns),
// links, addresses, routes (every table, both families), policy rules,
// nftables ruleset and mounts; `hostcheck compare FILE` reads them again and
// exits 1, printing what is gone and what was added, if anything differs.
//
// Before comparing, compare removes what dockerd and containerd's shims
// create on their first run ever on a machine (harness.FirstRunPaths) when
// it was not there at save: a fresh machine must end as it began.
//
// One difference is allowed, and reported as a note: /run/netns becoming a
// mount of itself. netns.Create prepares it so before its first pin, as
// iproute2 and podman do on first use; nobody undoes it, because unmounting
// it would hide every namespace pinned below it. Nothing else is ignored:
// not table 119 (skeind's export table lives in the tests' node namespaces,
// never on the host), not docker's or podman's state, not a leftover pin.
// IPv6 temporary addresses are left out of both pictures (see
// harness.ReadHost): the kernel rotates them on its own schedule.
//
// `hostcheck clean [-n]` removes what the tests leave behind when a test
// binary is killed before its cleanup (scripts/fresh-check.sh runs it
// first); -n only lists it. See clean.go for what it looks for.
//
// Usage (as root): hostcheck save FILE | hostcheck compare FILE | hostcheck clean [-n]
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/skeinnet/skein/test/harness"
)

// settle is how long compare keeps re-reading a host that differs: lazy
// unmounts and exiting helper processes (conmon, shims) finish
// asynchronously after the last test returns.
const settle = 5 * time.Second

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "save":
		err = save(os.Args[2])
	case len(os.Args) == 3 && os.Args[1] == "compare":
		err = compare(os.Args[2])
	case len(os.Args) == 2 && os.Args[1] == "clean":
		err = clean(false)
	case len(os.Args) == 3 && os.Args[1] == "clean" && os.Args[2] == "-n":
		err = clean(true)
	default:
		fmt.Fprintln(os.Stderr, "usage: hostcheck save FILE | hostcheck compare FILE | hostcheck clean [-n]")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostcheck:", err)
		os.Exit(1)
	}
}

func save(file string) error {
	host, err := harness.ReadHost()
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(host, "", "  ")
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return fmt.Errorf("save the host's state: %w", err)
	}
	nft := fmt.Sprint(len(host.NFT))
	if host.NFT == nil {
		nft = "no (nft is not installed)"
	}
	fmt.Printf("hostcheck: recorded the host (%d links, %d routes, %d rules, %s nftables lines, %d mounts, %d pinned namespaces, %d watched paths) in %s\n",
		len(host.Net.Links), len(host.Net.Routes), len(host.Net.Rules), nft, len(host.Mounts), len(host.NetNS), len(host.Paths), file)
	return nil
}

func compare(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read the state saved before the tests: %w", err)
	}
	var before harness.Host
	if err := json.Unmarshal(b, &before); err != nil {
		return fmt.Errorf("decode %s: %w", file, err)
	}
	var diffs []harness.HostDiff
	var notes []string
	if before.FirstRun != nil {
		// What dockerd and containerd's shims create on a machine where
		// they never ran goes again, if this run created it (see
		// harness.FirstRunPaths); anything else they left still shows.
		removed, err := harness.TidyFirstRun(before.FirstRun)
		for _, p := range removed {
			notes = append(notes, fmt.Sprintf("removed %s: the tests' runtimes created it on their first run on this machine", p))
		}
		if err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(settle); ; time.Sleep(250 * time.Millisecond) {
		after, err := harness.ReadHost()
		if err != nil {
			return err
		}
		diffs, notes = allow(before, harness.CompareHost(before, after, true))
		if len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, n := range notes {
		fmt.Println("hostcheck: note:", n)
	}
	if len(diffs) == 0 {
		fmt.Println("hostcheck: the host is as it was before the tests")
		return nil
	}
	fmt.Println("hostcheck: the tests left the host changed:")
	for _, d := range diffs {
		fmt.Println(d)
	}
	fmt.Printf("(namespaces named %s<prefix>-<hex> come from harness.NewNS(t, prefix))\n", harness.NamePrefix)
	return fmt.Errorf("the host differs from before the tests in %d part(s)", len(diffs))
}

// allow takes the one allowed difference out of diffs: a mount of
// harness.NetNSDir onto itself that was not there before.
func allow(before harness.Host, diffs []harness.HostDiff) ([]harness.HostDiff, []string) {
	hadDir := slices.ContainsFunc(before.Mounts, func(m string) bool {
		return strings.HasPrefix(m, harness.NetNSDir+" ")
	})
	var out []harness.HostDiff
	var notes []string
	for _, d := range diffs {
		if d.What == "mounts" && !hadDir {
			d.Added = slices.DeleteFunc(d.Added, func(m string) bool {
				if harness.NetNSDirMount(m) {
					notes = append(notes, fmt.Sprintf("%s is now a mount of itself, as iproute2 and podman leave it (%s)", harness.NetNSDir, m))
					return true
				}
				return false
			})
			if len(d.Gone)+len(d.Added) == 0 {
				continue
			}
		}
		out = append(out, d)
	}
	return out, notes
}
