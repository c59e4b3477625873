// Command skein-vmwrapper starts a VM with the taps skeind made for it, the
// way Virtlet's vmwrapper does: a VM runtime (libvirt, or a script) runs it
// in place of the emulator with the emulator's arguments. It fetches the
// container's open tap descriptors from skeind (package
// internal/vm/handover), appends one
//
//	-netdev tap,id=skeinN,fd=FD -device virtio-net-pci,netdev=skeinN,mac=MAC
//
// per interface, and execs the emulator, which inherits the descriptors.
//
// Environment (libvirt passes it with <qemu:env>):
//
//	SKEIN_VM_CONTAINER_ID  the CNI container ID of the VM's pod (unset, and
//	                       SKEIN_VM_IN_POD unset: run the emulator
//	                       unchanged — libvirt probes it so)
//	SKEIN_VM_IN_POD        "1": the wrapper runs inside the VM's pod (qemu
//	                       as a pod's container): it proves it with its
//	                       network namespace, no container ID or token
//	SKEIN_VM_EMULATOR      the emulator (default qemu-system-x86_64 in $PATH)
//	SKEIN_VM_SOCKET        skeind's VM socket (default /run/skein/vm.sock)
//	SKEIN_VM_TOKEN         the container's token, or else it is read from
//	SKEIN_VM_TOKEN_DIR     /<container ID> (default /run/skein/vm-tokens)
//	SKEIN_VM_NIC           the NIC model (default virtio-net-pci)
//	SKEIN_VM_NIC_OPTS      extra -device options, e.g. "romfile="
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/vm/handover"
)

// keep holds the tap files until exec, so no finalizer closes them.
var keep []*os.File

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "skein-vmwrapper:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(args []string) error {
	emulator, err := exec.LookPath(env("SKEIN_VM_EMULATOR", "qemu-system-x86_64"))
	if err != nil {
		return fmt.Errorf("emulator: %w", err)
	}
	argv := append([]string{emulator}, args...)
	id, inPod := os.Getenv("SKEIN_VM_CONTAINER_ID"), os.Getenv("SKEIN_VM_IN_POD")
	if inPod != "" && inPod != "1" && inPod != "0" {
		return fmt.Errorf("SKEIN_VM_IN_POD=%q: want 1 or 0", inPod)
	}
	if id != "" && inPod == "1" {
		return fmt.Errorf("SKEIN_VM_CONTAINER_ID and SKEIN_VM_IN_POD=1 both set: choose one")
	}
	if id != "" || inPod == "1" {
		socket := env("SKEIN_VM_SOCKET", handover.DefaultSocket)
		var ifs []handover.Interface
		var files []*os.File
		if inPod == "1" {
			ifs, files, err = handover.FetchOwn(socket, 10*time.Second)
		} else {
			token := os.Getenv("SKEIN_VM_TOKEN")
			if token == "" {
				if token, err = handover.ReadToken(env("SKEIN_VM_TOKEN_DIR", handover.DefaultTokenDir), id); err != nil {
					return err
				}
			}
			ifs, files, err = handover.Fetch(socket, id, token, 10*time.Second)
		}
		if err != nil {
			return err
		}
		keep = files
		nic, opts := env("SKEIN_VM_NIC", "virtio-net-pci"), os.Getenv("SKEIN_VM_NIC_OPTS")
		for i, itf := range ifs {
			fd := int(files[i].Fd())
			// The descriptors arrive close-on-exec; the emulator needs them.
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
				return fmt.Errorf("keep tap descriptor %d open: %w", fd, err)
			}
			dev := fmt.Sprintf("%s,netdev=skein%d,mac=%s", nic, i, itf.MAC)
			if opts != "" {
				dev += "," + strings.TrimPrefix(opts, ",")
			}
			argv = append(argv, "-netdev", fmt.Sprintf("tap,id=skein%d,fd=%d", i, fd), "-device", dev)
		}
	}
	return syscall.Exec(emulator, argv, os.Environ())
}
