package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/skeinnet/skein/internal/kurma/pack"
)

func (a *app) imageCmd() *cobra.Command {
	cmd := groupCmd("image", "Build pod network images", "images")
	cmd.AddCommand(a.imagePackCNICmd())
	return cmd
}

// defaultPackOutput is where pack-cni writes without -o.
const defaultPackOutput = "cni-netplugin.tar"

func (a *app) imagePackCNICmd() *cobra.Command {
	var plugins []string
	var shim, out, tag string
	cmd := &cobra.Command{
		Use:   "pack-cni --plugin PATH... [-o FILE]",
		Short: "Pack CNI plugin binaries into a pod network image",
		Long: "Pack CNI plugin executables into an OCI image (a `docker save` archive)\n" +
			"that makes them a pod network: /opt/network/add and /opt/network/del run\n" +
			"the skein-netplugin shim, which calls /opt/cni/bin/<the config's type>\n" +
			"as a CNI runtime would. The shared libraries of dynamically linked\n" +
			"plugins are packed with them; /var/lib/cni (host-local's state) is the\n" +
			"network's state directory. The same inputs give the same bytes.\n\n" +
			"Use the archive as `image: file:///path/FILE`, serve it over http(s)\n" +
			"with `digest:` set to the archive digest printed, or push it to a\n" +
			"registry (skopeo copy docker-archive:FILE docker://…) and name it by\n" +
			"the manifest digest printed.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(plugins) == 0 {
				return usagef("pack-cni needs at least one --plugin")
			}
			if shim == "" {
				var err error
				if shim, err = shimBesideSelf(); err != nil {
					return usagef("%v; give --shim", err)
				}
			}
			return a.packCNI(pack.Options{Plugins: plugins, Shim: shim, Tag: tag}, out)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&plugins, "plugin", nil, "a CNI plugin executable to pack (repeat); its file name is the config's type")
	f.StringVar(&shim, "shim", "", "the statically linked skein-netplugin (default: beside skeinctl)")
	// Shadows the global --output (table/json) for this command, which
	// prints no table: here it names the archive.
	f.StringVarP(&out, "output", "o", defaultPackOutput, "the archive to write")
	f.StringVar(&tag, "tag", pack.DefaultTag, "the image's name inside the archive")
	return cmd
}

// shimBesideSelf is skein-netplugin in skeinctl's own directory.
func shimBesideSelf() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find skeinctl's directory: %w", err)
	}
	p := filepath.Join(filepath.Dir(exe), pack.ShimName)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no %s beside skeinctl (%s)", pack.ShimName, p)
	}
	return p, nil
}

// packCNI writes the archive through a temporary file renamed into place,
// so a failure leaves no partial archive, and prints what to put in a
// config.
func (a *app) packCNI(o pack.Options, out string) (err error) {
	abs, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("output %q: %w", out, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(abs), "."+filepath.Base(abs)+".*")
	if err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	sum := sha256.New()
	img, err := pack.Write(io.MultiWriter(tmp, sum), o)
	if err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp.Name(), abs); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	manifest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	names := strings.ReplaceAll(cf.Config.Labels[pack.PluginsLabel], ",", ", ")
	fmt.Fprintf(a.stdout, "wrote %s: %s (%s)\n", abs, names, cf.Architecture)
	fmt.Fprintf(a.stdout, "archive digest:  sha256:%s  (file:// and http(s):// images)\n", hex.EncodeToString(sum.Sum(nil)))
	fmt.Fprintf(a.stdout, "manifest digest: %s  (docker://HOST/REPO@ once pushed)\n", manifest)
	return nil
}
