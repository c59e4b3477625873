package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/skeinnet/skein/test/skeintest"
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
	env := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	r, err := skeintest.ExecPlugin(filepath.Join(e.d.BinDir, "skein"), env, stdin)
	switch {
	case err != nil:
		t.Fatal(err)
	case r.Exit == 0:
		return r.Stdout, string(r.Stderr), nil
	case r.SpecErr == nil:
		return r.Stdout, string(r.Stderr), fmt.Errorf("skein exited %d without a spec error on stdout (stdout %q, stderr %q)", r.Exit, r.Stdout, r.Stderr)
	}
	return r.Stdout, string(r.Stderr), r.SpecErr
}
