// Command skein-bench measures skein side by side with the CNI reference
// plugins (bridge+host-local, ptp+host-local), the raw-netlink floor of the
// same plumbing and the exec floor (a Go plugin that only prints a canned
// result), on this machine in one run: ADD and DEL latency through libcni
// at several node sizes and concurrencies, churn throughput, skein and the
// floor with dual-stack pools, pod-to-pod TCP against a bare veth pair, and
// skeind's restart time and memory. It writes report.md, results.json and
// PNG charts into -out, with a progress bar on stderr.
//
// It needs root and builds every node and pod as a throwaway network
// namespace; the host's own network is never touched.
//
//	skein-bench -bin bin -out bench/out [-quick]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/bench"
)

func main() {
	quick := flag.Bool("quick", false, "fewer operations and no 5,000-attachment level (under two minutes)")
	out := flag.String("out", "bench/out", "directory for report.md, results.json and the charts")
	bin := flag.String("bin", "", "directory with skein and skeind (default: build them from this checkout)")
	levels := flag.String("levels", "", "attachments on the node, comma-separated (overrides the preset)")
	conc := flag.String("concurrency", "", "concurrent runtime calls, comma-separated (overrides the preset)")
	dualLevels := flag.String("dual-levels", "", "attachments on the node for the dual-stack rows, comma-separated (overrides the preset; \"none\": no such rows)")
	ops := flag.Int("ops", 0, "ADD+DEL pairs per contender, level and concurrency (overrides the preset)")
	headOps := flag.Int("head-ops", -1, "ADD+DEL pairs per contender and concurrency of the head-to-head phase (overrides the preset; 0: no such phase)")
	dual := flag.Bool("dual", false, "give every contender IPv6 addresses too")
	only := flag.String("contenders", "", "comma-separated subset of floor,exec-floor,skein,bridge+host-local,ptp+host-local,floor-dual,skein-dual")
	verbose := flag.Bool("v", false, "log the test bed's messages")
	flag.Parse()

	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "skein-bench: needs root (it creates network namespaces)")
		os.Exit(2)
	}
	cfg := bench.Full()
	if *quick {
		cfg = bench.Quick()
	}
	var err error
	if *levels != "" {
		if cfg.Levels, err = ints(*levels); err != nil {
			fail("-levels: %v", err)
		}
	}
	if *conc != "" {
		if cfg.Concurrency, err = ints(*conc); err != nil {
			fail("-concurrency: %v", err)
		}
	}
	switch *dualLevels {
	case "":
	case "none":
		cfg.DualLevels = nil
	default:
		if cfg.DualLevels, err = ints(*dualLevels); err != nil {
			fail("-dual-levels: %v", err)
		}
	}
	if *ops > 0 {
		cfg.Ops = *ops
	}
	if *headOps >= 0 {
		cfg.HeadOps = *headOps
	}
	if *only != "" {
		cfg.Contenders = strings.Split(*only, ",")
	}
	cfg.Dual, cfg.Verbose = *dual, *verbose
	if cfg.Out, err = filepath.Abs(*out); err != nil {
		fail("-out: %v", err)
	}
	if *bin != "" {
		abs, err := filepath.Abs(*bin)
		if err != nil {
			fail("-bin: %v", err)
		}
		os.Setenv("SKEIN_BIN_DIR", abs)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, ttyErr := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS)
	rep, err := bench.Execute(ctx, cfg, os.Stderr, ttyErr == nil)
	if err != nil {
		fail("write report: %v", err)
	}
	fmt.Printf("report: %s\n", filepath.Join(cfg.Out, "report.md"))
	for _, e := range rep.Errors {
		fmt.Fprintf(os.Stderr, "skein-bench: %s\n", e)
	}
	if len(rep.Errors) > 0 {
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "skein-bench: "+format+"\n", args...)
	os.Exit(2)
}
