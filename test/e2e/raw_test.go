package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// The helpers here execute the skein binary directly, for what libcni
// cannot send: missing environment variables, undecodable stdin, names
// libcni refuses before it runs any plugin.

// rawVars is a complete CNI environment for one call.
func (e *env) rawVars(cmd, containerID, netns, ifName string) map[string]string {
	return map[string]string{
		"CNI_COMMAND":     cmd,
		"CNI_CONTAINERID": containerID,
		"CNI_NETNS":       netns,
		"CNI_IFNAME":      ifName,
		"CNI_PATH":        e.d.BinDir,
	}
}

// rawConf is a skein network configuration pointing at this daemon.
func (e *env) rawConf(t testing.TB, name, version string, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{"cniVersion": version, "name": name, "type": "skein", "socket": e.d.Socket}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawCNI runs the skein binary with exactly vars (plus PATH) in its
// environment and stdin on its standard input. A zero exit gives a nil
// error; otherwise the error is the *types.Error the plugin printed, or a
// plain error if it printed none.
func (e *env) rawCNI(t testing.TB, vars map[string]string, stdin []byte) (stdout []byte, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.d.BinDir, "skein"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	runErr := cmd.Run()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		t.Fatalf("run skein: %v", runErr)
	}
	if runErr == nil {
		return out.Bytes(), errOut.String(), nil
	}
	var e2 types.Error
	if jerr := json.Unmarshal(out.Bytes(), &e2); jerr != nil || e2.Code == 0 {
		return out.Bytes(), errOut.String(), fmt.Errorf("skein exited %d without a spec error on stdout (stdout %q, stderr %q)", exit.ExitCode(), out.String(), errOut.String())
	}
	return out.Bytes(), errOut.String(), &e2
}
