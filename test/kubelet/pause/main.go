// Command pause is the sandbox ("infra") container of test/kubelet's
// nodes, built here so that no image comes from outside: it holds the
// pod's namespaces open, reaps the zombies of a shared PID namespace, and
// exits at SIGINT or SIGTERM, as the pause images of Kubernetes do.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
