// Command skein-install puts skein's CNI plugins and network configuration
// onto a node. The skeind DaemonSet runs it as an init container (the image
// is FROM scratch: there is no shell to copy with) with the host's
// /opt/cni/bin and /etc/cni/net.d mounted in.
//
// Each file is written beside its destination under a temporary name and
// renamed over it, so a container runtime exec'ing the plugin, or reading
// the configuration, never sees half a file. Installing twice is harmless.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "skein-install: %s\n", err)
		os.Exit(1)
	}
}

// config is what to install from where.
type config struct {
	srcDir   string   // where the plugins are (default: beside this binary)
	plugins  []string // plugin file names in srcDir
	binDir   string   // the host's CNI plugin directory
	conf     string   // a network configuration file, or ""
	confDir  string   // the host's CNI configuration directory
	confMode os.FileMode
}

func run(args []string, stdout io.Writer) error {
	c, err := parseFlags(args)
	if err != nil {
		return err
	}
	// Every source is checked before anything is written: bad input
	// installs nothing.
	srcs := make([]string, 0, len(c.plugins)+1)
	for _, p := range c.plugins {
		srcs = append(srcs, filepath.Join(c.srcDir, p))
	}
	if c.conf != "" {
		srcs = append(srcs, c.conf)
	}
	for _, src := range srcs {
		if err := checkSource(src); err != nil {
			return err
		}
	}
	for _, p := range c.plugins {
		dst := filepath.Join(c.binDir, p)
		if err := install(filepath.Join(c.srcDir, p), dst, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "installed %s\n", dst)
	}
	if c.conf != "" {
		dst := filepath.Join(c.confDir, filepath.Base(c.conf))
		if err := install(c.conf, dst, c.confMode); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "installed %s\n", dst)
	}
	return nil
}

func parseFlags(args []string) (*config, error) {
	c := &config{confMode: 0o644}
	f := pflag.NewFlagSet("skein-install", pflag.ContinueOnError)
	f.StringVar(&c.srcDir, "src-dir", "", "directory holding the plugins (default: this binary's)")
	f.StringSliceVar(&c.plugins, "plugins", []string{"skein-cni", "skein", "skein-vm"}, "plugin file names to install, in order (skein-cni before skein, which execs it)")
	f.StringVar(&c.binDir, "bin-dir", "/opt/cni/bin", "CNI plugin directory to install into")
	f.StringVar(&c.conf, "conf", "", "network configuration file to install (none if empty)")
	f.StringVar(&c.confDir, "conf-dir", "/etc/cni/net.d", "CNI configuration directory to install into")
	if err := f.Parse(args); err != nil {
		return nil, err
	}
	if f.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", f.Arg(0))
	}
	if c.srcDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find this binary's directory (give --src-dir): %w", err)
		}
		c.srcDir = filepath.Dir(exe)
	}
	for _, p := range c.plugins {
		if p == "" || strings.ContainsRune(p, '/') || p == "." || p == ".." {
			return nil, fmt.Errorf("invalid plugin name %q: want a file name", p)
		}
	}
	if c.binDir == "" {
		return nil, errors.New("--bin-dir must not be empty")
	}
	if c.conf != "" && c.confDir == "" {
		return nil, errors.New("--conf-dir must not be empty when --conf is given")
	}
	return c, nil
}

// checkSource reports whether src is a regular file that can be read.
func checkSource(src string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("check source: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("check source: %s is not a regular file", src)
	}
	return nil
}

// install copies src to dst with mode through a temporary file in dst's
// directory renamed over dst.
func install(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("install %s: %s is not a regular file", dst, src)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	return nil
}
