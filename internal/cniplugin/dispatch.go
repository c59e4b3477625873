package cniplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/skeinnet/skein/internal/cnispec"
)

// This file does for the plugin binaries what the CNI library's skel
// package does for plugins — read the environment and stdin, check them,
// gate each verb by the configuration's version, call the verb, answer
// VERSION — with the same checks, in the same order, giving the same
// codes and messages (dispatch_test.go runs both on the same inputs). skel
// links the library's result types, regexp, log and a netns package, and
// their start-up costs every exec of the plugin about half a millisecond
// on the 2-core machines we measure on; this needs encoding/json only.

// Spec error codes the plugin gives itself (SPEC.md, "Error").
const (
	errIncompatibleCNIVersion      = 1
	errUnknownContainer            = 3
	errInvalidEnvironmentVariables = 4
	errIOFailure                   = 5
	errDecodingFailure             = 6
	errInvalidNetworkConfig        = 7
	errInvalidNetNS                = 8
	errTryAgainLater               = 11
	errPluginNotAvailable          = 50
	errInternal                    = 999
)

// Error is a CNI spec error: what the plugin prints, with the
// configuration's cniVersion, and exits 1 for.
type Error struct {
	Code    uint
	Msg     string
	Details string
}

func (e *Error) Error() string {
	if e.Details != "" {
		return e.Msg + "; " + e.Details
	}
	return e.Msg
}

func newError(code uint, msg, details string) *Error {
	return &Error{Code: code, Msg: msg, Details: details}
}

// Args is one request as the runtime gave it.
type Args struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// Verbs are the functions behind the CNI verbs; a nil one is a verb the
// plugin accepts and does nothing for.
type Verbs struct {
	Add, Del, Check, GC, Status func(*Args) error
}

// envVars are the variables a runtime sets, in the order they are checked,
// with the verbs that require them and their validators.
var envVars = []struct {
	name     string
	required map[string]bool
	validate func(string) *Error
}{
	{"CNI_COMMAND", map[string]bool{"ADD": true, "CHECK": true, "DEL": true, "GC": true, "STATUS": true}, nil},
	{"CNI_CONTAINERID", map[string]bool{"ADD": true, "CHECK": true, "DEL": true}, validateContainerID},
	{"CNI_NETNS", map[string]bool{"ADD": true, "CHECK": true}, nil},
	{"CNI_IFNAME", map[string]bool{"ADD": true, "CHECK": true, "DEL": true}, validateIfName},
	{"CNI_ARGS", nil, nil},
	{"CNI_PATH", map[string]bool{"ADD": true, "CHECK": true, "DEL": true, "GC": true, "STATUS": true}, nil},
	{"CNI_NETNS_OVERRIDE", nil, nil},
}

// dispatch runs one request: getenv and stdin are the runtime's, VERSION
// and the "about" lines (without CNI_COMMAND) go to stdout and stderr;
// ownNetNS reports whether CNI_NETNS is the plugin's own namespace.
func dispatch(getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer, v Verbs, about string, ownNetNS bool) *Error {
	cmd := getenv("CNI_COMMAND")
	vals := make(map[string]string, len(envVars))
	var missing []string
	for _, ev := range envVars {
		val := getenv(ev.name)
		vals[ev.name] = val
		switch {
		case val == "" && (ev.required[cmd] || ev.name == "CNI_COMMAND"):
			missing = append(missing, ev.name)
		case val != "" && ev.required[cmd] && ev.validate != nil:
			if err := ev.validate(val); err != nil {
				return err
			}
		}
	}
	if len(missing) > 0 {
		if cmd == "" && about != "" {
			fmt.Fprintln(stderr, about)
			fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(cnispec.Versions, ", "))
			return nil
		}
		return newError(errInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	if cmd == "VERSION" {
		stdin = strings.NewReader("")
	}
	data, err := io.ReadAll(stdin)
	if err != nil {
		return newError(errIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	if cmd != "VERSION" {
		if err := validateConfig(data); err != nil {
			return err
		}
	}
	args := &Args{
		ContainerID: vals["CNI_CONTAINERID"], Netns: vals["CNI_NETNS"], IfName: vals["CNI_IFNAME"],
		Args: vals["CNI_ARGS"], Path: vals["CNI_PATH"], NetnsOverride: vals["CNI_NETNS_OVERRIDE"], StdinData: data,
	}

	switch cmd {
	case "ADD", "DEL":
		fn := v.Add
		if cmd == "DEL" {
			fn = v.Del
		}
		if err := checkVersionAndCall(args, fn); err != nil {
			return err
		}
		// As skel does: after the verb, refuse a CNI_NETNS that is the
		// plugin's own namespace (unless the runtime overrides the check).
		if o := args.NetnsOverride; strings.ToUpper(o) != "TRUE" && o != "1" && ownNetNS {
			return newError(errInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", "")
		}
		return nil
	case "CHECK":
		return gatedCall(args, "0.4.0", cmd, v.Check)
	case "GC":
		return gatedCall(args, "1.1.0", cmd, v.GC)
	case "STATUS":
		return gatedCall(args, "1.1.0", cmd, v.Status)
	case "VERSION":
		out, _ := json.Marshal(struct {
			CNIVersion        string   `json:"cniVersion"`
			SupportedVersions []string `json:"supportedVersions,omitempty"`
		}{cnispec.Newest, cnispec.Versions})
		if _, err := stdout.Write(append(out, '\n')); err != nil {
			return newError(errIOFailure, err.Error(), "")
		}
		return nil
	}
	return newError(errInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
}

// gatedCall calls a verb that exists from spec version since on, if the
// configuration's version has it and skein speaks a version at least as new.
func gatedCall(args *Args, since, verb string, fn func(*Args) error) *Error {
	confVersion, err := decodeVersion(args.StdinData)
	if err != nil {
		return newError(errDecodingFailure, err.Error(), "")
	}
	if ok, err := atLeast(confVersion, since); err != nil {
		return newError(errDecodingFailure, err.Error(), "")
	} else if !ok {
		return newError(errIncompatibleCNIVersion, "config version does not allow "+verb, "")
	}
	for _, pv := range cnispec.Versions {
		ok, err := atLeast(pv, confVersion)
		if err != nil {
			return newError(errDecodingFailure, err.Error(), "")
		}
		if ok {
			return checkVersionAndCall(args, fn)
		}
	}
	return newError(errIncompatibleCNIVersion, "plugin version does not allow "+verb, "")
}

// checkVersionAndCall refuses a configuration version skein does not speak,
// then calls fn; an error that is not an *Error becomes an internal one.
func checkVersionAndCall(args *Args, fn func(*Args) error) *Error {
	confVersion, err := decodeVersion(args.StdinData)
	if err != nil {
		return newError(errDecodingFailure, err.Error(), "")
	}
	supported := false
	for _, v := range cnispec.Versions {
		supported = supported || v == confVersion
	}
	if !supported {
		return newError(errIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", confVersion, cnispec.Versions))
	}
	if fn == nil {
		return nil
	}
	if err := fn(args); err != nil {
		if e, ok := err.(*Error); ok {
			return e
		}
		return newError(errInternal, err.Error(), "")
	}
	return nil
}

// validateConfig is the check every verb but VERSION makes first: the
// configuration decodes and names a network.
func validateConfig(data []byte) *Error {
	var c struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return newError(errDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
	}
	if c.Name == "" {
		return newError(errInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(c.Name) {
		return newError(errInvalidNetworkConfig, "invalid characters found in network name", c.Name)
	}
	return nil
}

// decodeVersion is the configuration's cniVersion; none is 0.1.0.
func decodeVersion(data []byte) (string, error) {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return "", fmt.Errorf("decoding version from network config: %w", err)
	}
	if c.CNIVersion == "" {
		return "0.1.0", nil
	}
	return c.CNIVersion, nil
}

// atLeast compares two spec versions ("major[.minor[.micro]]", "" being
// 0.1.0) as the CNI library does.
func atLeast(v, other string) (bool, error) {
	a, err := parseVersion(v)
	if err != nil {
		return false, err
	}
	b, err := parseVersion(other)
	if err != nil {
		return false, err
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i], nil
		}
	}
	return true, nil
}

func parseVersion(v string) ([3]int, error) {
	if v == "" {
		return [3]int{0, 1, 0}, nil
	}
	parts := strings.Split(v, ".")
	if len(parts) >= 4 {
		return [3]int{}, fmt.Errorf("invalid version %q: too many parts", v)
	}
	var out [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return [3]int{}, fmt.Errorf("failed to convert %s version part %q: %w", [3]string{"major", "minor", "micro"}[i], p, err)
		}
		out[i] = n
	}
	return out, nil
}

// validName is the spec's rule for container IDs and network names:
// ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

func validateContainerID(id string) *Error {
	if id == "" {
		return newError(errUnknownContainer, "missing containerID", "")
	}
	if !validName(id) {
		return newError(errInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// maxIfName is the kernel's limit on interface names (IFNAMSIZ - 1).
const maxIfName = 15

func validateIfName(name string) *Error {
	switch {
	case name == "":
		return newError(errInvalidEnvironmentVariables, "interface name is empty", "")
	case len(name) > maxIfName:
		return newError(errInvalidEnvironmentVariables, "interface name is too long", fmt.Sprintf("interface name should be less than %d characters", maxIfName+1))
	case name == "." || name == "..":
		return newError(errInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	for s := name; s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return newError(errInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
		}
		s = s[n:]
	}
	return nil
}
