// Command skein-netplugin turns a CNI plugin into a Kurma pod network. It is
// the /opt/network/add and /opt/network/del of the images `skeinctl image
// pack-cni` builds (one binary, the second name a hard link), and speaks the
// Kurma contract on one side and CNI on the other:
//
//	/opt/network/add NETNS UUID IFNAME < config
//	  → CNI_COMMAND=ADD CNI_CONTAINERID=UUID CNI_NETNS=NETNS CNI_IFNAME=IFNAME
//	    CNI_PATH=/opt/cni/bin /opt/cni/bin/<config's type> < config
//
// The operation comes from the name it was started by (add or del; run as
// skein-netplugin, the first argument names it). CNI_PATH is the cni/bin
// directory beside the directory holding the shim (/opt/network/add →
// /opt/cni/bin), so an unpacked image works the same outside a sandbox.
// CNI_ARGS in the shim's own environment is passed on; skeind never sets
// it (the Kurma contract has no place for it, and the image's environment
// is all a sandboxed call gets), so it only matters when the shim is run
// by hand or by another runtime. On DEL, CNI_NETNS is
// left unset when NETNS does not exist (the pod's namespace is gone): the
// plugins then free what lives outside it, as CNI asks.
//
// What the shim adds to a bare exec (the reason it is not a shell script):
//   - a missing or unusable plugin, a config without a type, a missing
//     argument: a CNI error object on stdout and exit 1, never a half call;
//   - the ADD result is kept in the network's state directory
//     (/var/lib/network, the one writable place of a sandboxed call) and
//     given to DEL as prevResult, as CNI ≥ 0.4.0 asks of a runtime; the
//     Kurma contract has no way to pass it;
//   - the plugin's stderr passes through untouched; its stdout is the
//     result, printed only once the plugin succeeded.
//
// IPAM plugins that keep state (host-local writes /var/lib/cni/networks)
// find it in the state directory too: pack-cni's image links /var/lib/cni to
// /var/lib/network.
//
// The shim is linked statically and imports only the standard library: it
// starts for every call. For the same reason it does not size GOMAXPROCS
// from its cgroup (reading those files costs more than it saves), and
// pack-cni's images set GOMAXPROCS=1 for it and the plugins it starts.
//
//go:debug containermaxprocs=0
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// stateDir is where the sandbox binds the network's writable state
// directory; SKEIN_NETPLUGIN_STATE overrides it (running the shim outside a
// sandbox, as tests do).
const stateDir = "/var/lib/network"

// resultsDir holds the kept ADD results, under the state directory.
const resultsDir = "skein-netplugin"

// maxConfig caps the config read from stdin.
const maxConfig = 4 << 20

// CNI error codes (CNI spec, "Error").
const (
	codeInvalidEnv    = 4
	codeIOFailure     = 5
	codeDecoding      = 6
	codeInvalidConfig = 7
)

// cniError is the error object CNI plugins print on stdout.
type cniError struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

func (e *cniError) Error() string { return e.Msg }

func errorf(code int, format string, args ...any) *cniError {
	return &cniError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr, os.Getenv, pluginDir()))
}

// call is one parsed invocation.
type call struct {
	op                  string // ADD or DEL
	netns, id, ifname   string
	config              []byte
	conf                map[string]json.RawMessage
	pluginType, version string
	name                string
}

// run is one invocation; binDir holds the CNI plugins.
func run(argv []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string, binDir string) int {
	c, err := parse(argv, stdin)
	if err == nil {
		err = c.exec(binDir, stdout, stderr, getenv)
	}
	if err == nil {
		return 0
	}
	var pe *pluginExit
	if errors.As(err, &pe) {
		// The plugin spoke for itself (its error object is already on
		// stdout); keep its exit status.
		return pe.code
	}
	var ce *cniError
	if !errors.As(err, &ce) {
		ce = &cniError{Code: codeIOFailure, Msg: err.Error()}
	}
	if c != nil {
		ce.CNIVersion = c.version
	}
	fmt.Fprintf(stderr, "skein-netplugin: %s\n", ce.Msg)
	b, _ := json.Marshal(ce)
	fmt.Fprintf(stdout, "%s\n", b)
	return 1
}

// parse reads the operation, the three Kurma arguments and the config.
func parse(argv []string, stdin io.Reader) (*call, error) {
	if len(argv) == 0 {
		return nil, errorf(codeInvalidEnv, "no program name")
	}
	c := &call{}
	args := argv[1:]
	switch filepath.Base(argv[0]) {
	case "add":
		c.op = "ADD"
	case "del":
		c.op = "DEL"
	default:
		if len(args) == 0 {
			return nil, errorf(codeInvalidEnv, "usage: skein-netplugin add|del NETNS UUID [IFNAME] < config")
		}
		switch args[0] {
		case "add":
			c.op = "ADD"
		case "del":
			c.op = "DEL"
		default:
			return nil, errorf(codeInvalidEnv, "unknown operation %q: want add or del", args[0])
		}
		args = args[1:]
	}
	if len(args) < 2 || len(args) > 3 {
		return nil, errorf(codeInvalidEnv, "want arguments NETNS UUID [IFNAME], got %d", len(args))
	}
	c.netns, c.id = args[0], args[1]
	if len(args) == 3 {
		c.ifname = args[2]
	}
	// A DEL may come without a netns (CNI allows it: the pod is gone).
	if (c.netns == "" && c.op != "DEL") || c.id == "" {
		return nil, errorf(codeInvalidEnv, "netns path and container UUID must not be empty")
	}

	config, err := io.ReadAll(io.LimitReader(stdin, maxConfig+1))
	if err != nil {
		return nil, errorf(codeIOFailure, "read config from stdin: %v", err)
	}
	if len(config) > maxConfig {
		return nil, errorf(codeInvalidConfig, "config on stdin is larger than %d bytes", maxConfig)
	}
	c.config = config
	if err := json.Unmarshal(config, &c.conf); err != nil {
		return nil, errorf(codeDecoding, "decode config from stdin: %v", err)
	}
	if err := c.str("cniVersion", &c.version); err != nil {
		return c, err
	}
	if err := c.str("name", &c.name); err != nil {
		return c, err
	}
	if err := c.str("type", &c.pluginType); err != nil {
		return c, err
	}
	switch t := c.pluginType; {
	case t == "":
		return c, errorf(codeInvalidConfig, "config has no \"type\": it names the CNI plugin to run")
	case t == "." || t == ".." || strings.ContainsAny(t, "/\x00"):
		return c, errorf(codeInvalidConfig, "config \"type\" %q is not a plugin name", t)
	}
	if c.ifname == "" {
		if c.pluginType != "loopback" {
			return c, errorf(codeInvalidEnv, "no interface name given (set the network's containerInterface)")
		}
		c.ifname = "lo"
	}
	return c, nil
}

// str reads an optional string field of the config.
func (c *call) str(key string, dst *string) error {
	raw, ok := c.conf[key]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return errorf(codeInvalidConfig, "config %q: want a string", key)
	}
	return nil
}

// pluginExit is a plugin's own failure, reported as it printed it.
type pluginExit struct{ code int }

func (e *pluginExit) Error() string { return "plugin exited with status " + strconv.Itoa(e.code) }

func (c *call) exec(binDir string, stdout, stderr io.Writer, getenv func(string) string) error {
	plugin := filepath.Join(binDir, c.pluginType)
	if fi, err := os.Stat(plugin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return errorf(codeInvalidConfig, "no CNI plugin %q in this image (%s)", c.pluginType, binDir)
	}

	state := getenv("SKEIN_NETPLUGIN_STATE")
	if state == "" {
		state = stateDir
	}
	kept := c.resultPath(state)
	config := c.config
	if c.op == "DEL" {
		config = c.withPrevResult(kept)
	}

	cmd := exec.Command(plugin)
	cmd.Stdin = bytes.NewReader(config)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = stderr
	cmd.Env = c.env(binDir, getenv("CNI_ARGS"))
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		_, _ = stdout.Write(out.Bytes())
		code := ee.ExitCode()
		if code <= 0 {
			code = 1 // killed by a signal
			fmt.Fprintf(stderr, "skein-netplugin: %s: %v\n", c.pluginType, err)
		}
		return &pluginExit{code: code}
	case err != nil:
		return errorf(codeIOFailure, "run CNI plugin %q: %v", c.pluginType, err)
	}

	switch c.op {
	case "ADD":
		if err := keep(kept, out.Bytes()); err != nil {
			// Not fatal: DEL works without prevResult for most plugins.
			fmt.Fprintf(stderr, "skein-netplugin: keep result for DEL: %v\n", err)
		}
	case "DEL":
		if kept != "" {
			if err := os.Remove(kept); err != nil && !errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(stderr, "skein-netplugin: remove kept result: %v\n", err)
			}
		}
	}
	_, err = stdout.Write(out.Bytes())
	return err
}

// pluginDir is cni/bin beside the directory the shim runs from.
func pluginDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "/opt/cni/bin"
	}
	return filepath.Join(filepath.Dir(filepath.Dir(exe)), "cni", "bin")
}

// env is the shim's environment with the CNI variables set.
func (c *call) env(binDir, cniArgs string) []string {
	netns := c.netns
	if c.op == "DEL" {
		// CNI wants DEL to succeed when the pod's namespace is gone, and
		// the plugins clean up what is outside it when CNI_NETNS is unset;
		// skeind binds no netns into the sandbox when it is gone.
		if _, err := os.Stat(netns); err != nil {
			netns = ""
		}
	}
	set := map[string]string{
		"CNI_COMMAND":     c.op,
		"CNI_CONTAINERID": c.id,
		"CNI_NETNS":       netns,
		"CNI_IFNAME":      c.ifname,
		"CNI_PATH":        binDir,
		"CNI_ARGS":        cniArgs,
	}
	var env []string
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if _, ok := set[k]; !ok {
			env = append(env, e)
		}
	}
	for _, k := range []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS"} {
		if set[k] != "" {
			env = append(env, k+"="+set[k])
		}
	}
	return env
}

// resultPath is where the ADD result of this (network, container,
// interface) is kept; "" when the state directory is not there.
func (c *call) resultPath(state string) string {
	if fi, err := os.Stat(state); err != nil || !fi.IsDir() {
		return ""
	}
	// A hash of the three, NUL-separated (none holds a NUL): joined with
	// a character they may contain, two calls could share a key.
	sum := sha256.Sum256([]byte(c.name + "\x00" + c.id + "\x00" + c.ifname))
	return filepath.Join(state, resultsDir, hex.EncodeToString(sum[:])+".json")
}

// withPrevResult adds the kept ADD result as prevResult when the config has
// none and its version has the field (0.4.0 and later).
func (c *call) withPrevResult(kept string) []byte {
	if kept == "" || !hasPrevResult(c.version) {
		return c.config
	}
	if _, ok := c.conf["prevResult"]; ok {
		return c.config
	}
	prev, err := os.ReadFile(kept)
	if err != nil || !json.Valid(prev) {
		return c.config
	}
	conf := make(map[string]json.RawMessage, len(c.conf)+1)
	for k, v := range c.conf {
		conf[k] = v
	}
	conf["prevResult"] = json.RawMessage(prev)
	b, err := json.Marshal(conf)
	if err != nil {
		return c.config
	}
	return b
}

// hasPrevResult reports whether CNI version v passes prevResult to DEL.
func hasPrevResult(v string) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 0 || minor >= 4
}

// keep writes the result atomically; a no-op without a state directory.
func keep(path string, result []byte) error {
	if path == "" || !json.Valid(result) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, result, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
