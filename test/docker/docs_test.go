package docker_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/tools"
)

// TestDocsCommands runs the commands of docs/docker.md's example block,
// as written, against a real dockerd served by skeind, so that the guide
// cannot show a flag, an option or a network shape skein refuses. Only the
// names the test environment must change are changed: the driver (each
// test registers its own plugin name), the image (the test's busybox) and
// docker's socket. The pool one line names is made first, as the guide
// says it must exist. Then everything is removed and nothing may be left.
func TestDocsCommands(t *testing.T) {
	cmds := docsCommands(t, filepath.Join("..", "..", "docs", "docker.md"))
	if len(cmds) < 4 {
		t.Fatalf("docs/docker.md's example block has %d commands; the test reads too little", len(cmds))
	}
	e := newEnv(t)
	var pool string
	for _, args := range cmds {
		for i, a := range args {
			if a == "skein.pool=default" || !strings.HasPrefix(a, "skein.pool=") || pool != "" {
				continue
			}
			pool = strings.TrimPrefix(args[i], "skein.pool=")
			if _, err := e.sk.Admin(t).CreatePool(context.Background(), &rpc.Pool{Name: pool, Subnets: []string{"10.95.0.0/24"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var nets []string
	for _, args := range cmds {
		if args[0] != "docker" {
			t.Fatalf("docs/docker.md's example runs %q, not docker: teach this test", args[0])
		}
		args = args[1:]
		for i, a := range args {
			switch {
			case a == "skein" && i > 0 && (args[i-1] == "-d" || args[i-1] == "--ipam-driver"):
				args[i] = e.driver
			case a == "busybox":
				args[i] = image
			}
		}
		if len(args) > 2 && args[0] == "network" && args[1] == "create" {
			nets = append(nets, args[len(args)-1])
		}
		if len(args) > 0 && args[0] == "run" {
			args = append([]string{"run", "--rm"}, args[1:]...)
		}
		out, err := e.docker(args...)
		if err != nil {
			t.Errorf("docs/docker.md: docker %s: %v", strings.Join(args, " "), err)
			continue
		}
		t.Logf("docker %s:\n%s", strings.Join(args, " "), out)
		// A container given an address shows it (the guide's `ip addr`).
		for i, a := range args {
			if a == "--ip" && i+1 < len(args) && !strings.Contains(out, "inet "+args[i+1]+"/") {
				t.Errorf("docs/docker.md: docker %s: the container does not show %s:\n%s", strings.Join(args, " "), args[i+1], out)
			}
		}
	}
	for _, n := range nets {
		e.mustDocker(t, "network", "rm", n)
	}
	if pool != "" {
		e.assertClean(t, pool)
	} else {
		e.assertClean(t)
	}
}

var continuation = regexp.MustCompile(`\\\n\s*`)

// docsCommands returns the commands of the first ```sh block of path, a
// continued line joined, comments dropped, split into words (the guide's
// commands use no quotes).
func docsCommands(t *testing.T, path string) [][]string {
	t.Helper()
	s, err := tools.FencedBlock(path, "sh")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(continuation.ReplaceAllString(s, ""), "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if strings.ContainsAny(line, `"'$`) {
			t.Fatalf("%s: %q quotes or expands: teach this test to split it", path, line)
		}
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}
