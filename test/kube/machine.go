package kube

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes this machine for a benchmark report: CPUs and their
// model, memory, kernel, Go, and the Kubernetes and etcd versions the
// tests run.
func Machine() string {
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
		strings.TrimSpace(string(kernel)), runtime.Version(), KubernetesVersion, EtcdVersion)
}
