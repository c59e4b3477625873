package guest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// goTool finds the go command: on PATH, else in the GOROOT this test
// binary was built with.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the go command is neither on PATH nor at %s", p)
	}
	return p, nil
}

// moduleRoot is the directory of the main module's go.mod, asked of the go
// command from the working directory (a test's package directory).
func moduleRoot(gocmd string) (string, error) {
	out, err := exec.Command(gocmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module (go env GOMOD is %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// testBinary builds pkg's tests as a static binary at out. Each Run
// builds its own (linking costs about a second; the go build cache keeps
// the compiled packages), so nothing outlives the test's temporary
// directory.
func testBinary(gocmd, root, pkg, tags, out string) error {
	args := []string{"test", "-c", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command(gocmd, append(args, pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the test binary of %s (CGO_ENABLED=0 go test -c): %w\n%s", pkg, err, buf.String())
	}
	if _, err := os.Stat(out); err != nil {
		// go test -c writes nothing for a package without test files.
		return fmt.Errorf("package %s has no test binary (no test files?): %w", pkg, err)
	}
	return nil
}
