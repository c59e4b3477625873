package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
)

// defaultSocket is where skeind listens unless told otherwise.
const defaultSocket = "/run/skein/skeind.sock"

// app holds the global flags and what every command shares.
type app struct {
	stdout io.Writer
	getenv func(string) string
	now    func() time.Time

	socket     string
	socketSet  bool   // --socket was given (then $KUBECONFIG alone does not switch to the API)
	kubeconfig string // pools and blocks from the API server (kube.go)
	output     string
	timeout    time.Duration

	// validated is set once cobra has accepted the command line and the
	// global flags have been checked. An error before that is a usage error
	// (unknown command, bad flag, wrong argument count).
	validated bool
}

// usageError marks an error found in the command line after cobra's own
// parsing, such as a missing required flag. It exits with code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func (a *app) isUsageError(err error) bool {
	var u *usageError
	return !a.validated || errors.As(err, &u)
}

func (a *app) rootCmd() *cobra.Command {
	socket := defaultSocket
	if s := a.getenv("SKEIN_SOCKET"); s != "" {
		socket = s
	}

	root := groupCmd("skeinctl", "Inspect and manage skein on this node")
	root.Long = "skeinctl manages address pools and inspects blocks, attachments and\n" +
		"the state of the node's skeind, over its UNIX socket. With a kubeconfig\n" +
		"(--kubeconfig or $KUBECONFIG) it reads a cluster's pools and blocks from\n" +
		"the Kubernetes API server instead."
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if a.output != "table" && a.output != "json" {
			return usagef("invalid --output %q: want table or json", a.output)
		}
		if a.timeout <= 0 {
			return usagef("invalid --timeout %s: must be positive", a.timeout)
		}
		a.socketSet = root.PersistentFlags().Changed("socket")
		a.validated = true
		return nil
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("%s", err) })

	f := root.PersistentFlags()
	f.StringVar(&a.socket, "socket", socket, "skeind's UNIX socket (env SKEIN_SOCKET)")
	f.StringVar(&a.kubeconfig, "kubeconfig", "", "read pools and blocks from the Kubernetes API server with this kubeconfig (default: $KUBECONFIG, unless --socket is given)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "how long to wait for skeind")

	root.AddCommand(a.poolCmd(), a.blockCmd(), a.attachmentCmd(), a.podCmd(), a.routeCmd(), a.statusCmd())
	return root
}

// groupCmd returns a command that only holds subcommands, the root among
// them. Run bare, it prints its help; with an unknown subcommand it is a
// usage error (cobra would otherwise print help and succeed).
func groupCmd(use, short string, aliases ...string) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Aliases: aliases,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
}

// noArgs rejects positional arguments.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return fmt.Errorf("%q takes no arguments, got %q", cmd.CommandPath(), args[0])
}

// oneArg requires exactly one positional argument, named name in messages.
func oneArg(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return fmt.Errorf("%q requires %s", cmd.CommandPath(), name)
		case len(args) > 1:
			return fmt.Errorf("%q takes only %s, got extra argument %q", cmd.CommandPath(), name, args[1])
		}
		return nil
	}
}
