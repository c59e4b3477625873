package routebench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/skeinnet/skein/test/kube"
)

var flagOut = flag.String("out", "", "directory for datapath.json, convergence.json and report.md (empty: only logged)")

// writeResults writes v as name under -out and rewrites report.md from
// every results file there.
func writeResults(name string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if *flagOut == "" {
		fmt.Printf("%s:\n%s\n", name, js)
		return nil
	}
	if err := os.MkdirAll(*flagOut, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*flagOut, name), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return writeReport(*flagOut)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			mem = fmt.Sprintf(", %.1f GiB RAM", kb/1024/1024)
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d × %s%s, Linux %s, %s, kubernetes %s, etcd %s", runtime.NumCPU(), cpu, mem,
		strings.TrimSpace(string(kernel)), runtime.Version(), kube.KubernetesVersion, kube.EtcdVersion)
}

// command is the go test invocation that reproduces this run.
func command() string {
	var args []string
	flag.Visit(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "test.") {
			args = append(args, fmt.Sprintf("-%s %s", f.Name, f.Value))
		}
	})
	bench := "Routing"
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		bench = f.Value.String()
	}
	return fmt.Sprintf("go test -run '^$' -bench '%s' -benchtime 1x ./test/routebench/ -args %s", bench, strings.Join(args, " "))
}
