package main

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/vm"
)

// vmFlags wires the VM front door (skein-vm, the tap handover socket).
type vmFlags struct {
	socket, tokenDir string
}

func (v *vmFlags) register(f *pflag.FlagSet) {
	f.StringVar(&v.socket, "vm-socket", "", "socket handing tap descriptors to VM launchers (default: vm.sock beside --socket, i.e. /run/skein/vm.sock), or \"off\" to serve no VMs")
	f.StringVar(&v.tokenDir, "vm-token-dir", "", "directory of the per-container VM tokens (default: vm-tokens beside --socket, i.e. /run/skein/vm-tokens)")
}

// serve registers the VM front door on d unless --vm-socket=off. The
// defaults follow --socket, so a skeind given its own socket directory
// (tests, a second instance) keeps its VM socket and tokens there too.
func (v *vmFlags) serve(ctx context.Context, d *daemon.Daemon, grpcSocket string) error {
	if v.socket == "off" {
		return nil
	}
	dir := filepath.Dir(cmp.Or(grpcSocket, daemon.DefaultSocket))
	o := vm.Options{
		Socket:   cmp.Or(v.socket, filepath.Join(dir, "vm.sock")),
		TokenDir: cmp.Or(v.tokenDir, filepath.Join(dir, "vm-tokens")),
	}
	if _, err := vm.Register(ctx, d, o); err != nil {
		return fmt.Errorf("vm front door: %w", err)
	}
	return nil
}

var _ vm.Host = (*daemon.Daemon)(nil)
