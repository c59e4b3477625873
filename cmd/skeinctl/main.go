// Command skeinctl is the operator CLI for skein. It talks to the node's
// skeind over the Admin gRPC service on a UNIX socket and prints what it gets
// back, either as aligned tables for people or as JSON for scripts.
//
// Exit codes: 0 on success, 1 when the call failed (skeind refused, is
// unreachable or timed out), 2 when the command line itself is wrong.
package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run executes one skeinctl invocation and returns its exit code. getenv is
// how the environment is read (SKEIN_SOCKET), so tests need not touch the
// process environment.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return runAt(args, stdout, stderr, getenv, time.Now)
}

// runAt is run with the clock ages are computed against.
func runAt(args []string, stdout, stderr io.Writer, getenv func(string) string, now func() time.Time) int {
	a := &app{stdout: stdout, getenv: getenv, now: now}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)

	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "skeinctl: %s\n", err)
	if a.isUsageError(err) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	return 1
}
