package docs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/vm"
	"github.com/skeinnet/skein/internal/webhook"
	"github.com/skeinnet/skein/test/skeintest"
)

// The configuration examples of README.md and docs/ are read by the code
// that reads them for real, so that a renamed field or a changed rule
// cannot leave a guide showing something skein refuses:
//
//   - every ```json block is a conflist (each skein and skein-vm plugin
//     in it parsed by the plugin's own parser, strictly: a key the plugin
//     does not know fails) or a skeind configuration with podNetworks
//     (parsed by the pod-network parser);
//   - every ```yaml block is decoded strictly into its kind (skein.dev
//     kinds and Pods) and skein.dev objects pass the admission webhook's
//     checks;
//   - every skeind flag a guide shows exists in `skeind --help`, and every
//     make target a guide names exists in the Makefile.
//
// The commands that need a cluster, Docker or a host to change are run by
// the tests of those features (test/docker, test/kubelet, test/demo), not
// here.

var fenceLangRE = regexp.MustCompile("(?s)```(\\w*)\n(.*?)```")

// root is the repository's top (the tests run in test/docs).
var root = func() string {
	r, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return r
}()

type block struct {
	file, lang, text string
}

// blocks returns the fenced blocks of README.md and docs/*.md.
func blocks(t *testing.T) []block {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	var out []block
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, m := range fenceLangRE.FindAllStringSubmatch(string(b), -1) {
			out = append(out, block{file: rel, lang: m[1], text: m[2]})
		}
	}
	return out
}

func TestJSONExamples(t *testing.T) {
	n := 0
	for _, b := range blocks(t) {
		if b.lang != "json" {
			continue
		}
		n++
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(b.text), &top); err != nil {
			t.Errorf("%s: a json block that is not JSON: %v\n%s", b.file, err, b.text)
			continue
		}
		switch {
		case top["plugins"] != nil:
			checkConflist(t, b)
		case top["podNetworks"] != nil:
			if _, err := kurma.ParseNetworks(top["podNetworks"]); err != nil {
				t.Errorf("%s: podNetworks refused: %v", b.file, err)
			}
		default:
			t.Errorf("%s: a json block that is neither a conflist nor a skeind configuration:\n%s", b.file, b.text)
		}
	}
	if n < 4 {
		t.Fatalf("found %d json blocks in the guides; the check reads too little", n)
	}
}

// checkConflist loads b as libcni does and parses each of skein's plugins
// with the configuration libcni would hand it.
func checkConflist(t *testing.T, b block) {
	list, err := libcni.ConfListFromBytes([]byte(b.text))
	if err != nil {
		t.Errorf("%s: libcni refuses the conflist: %v", b.file, err)
		return
	}
	for _, p := range list.Plugins {
		var conf map[string]any
		if err := json.Unmarshal(p.Bytes, &conf); err != nil {
			t.Fatal(err)
		}
		conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
		data, _ := json.Marshal(conf)
		switch p.Network.Type {
		case "skein":
			if _, err := cni.Parse(data); err != nil {
				t.Errorf("%s: skein refuses its entry: %v", b.file, err)
			}
			strict(t, b.file, data, &cni.NetConf{})
		case "skein-vm":
			if _, err := vm.ParseConf(data, false); err != nil {
				t.Errorf("%s: skein-vm refuses its entry: %v", b.file, err)
			}
			strict(t, b.file, data, &vm.NetConf{})
		}
	}
}

// strict decodes data into v refusing unknown keys: a key a guide shows
// that the plugin ignores is a typo or a renamed field.
func strict(t *testing.T, file string, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Errorf("%s: a key the plugin does not read: %v\n%s", file, err, data)
	}
}

func TestYAMLExamples(t *testing.T) {
	n := 0
	for _, b := range blocks(t) {
		if b.lang != "yaml" {
			continue
		}
		for _, doc := range strings.Split(b.text, "\n---\n") {
			n++
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Errorf("%s: not YAML: %v\n%s", b.file, err, doc)
				continue
			}
			if err := checkObject(meta.APIVersion, meta.Kind, []byte(doc)); err != nil {
				t.Errorf("%s: %s %s: %v\n%s", b.file, meta.APIVersion, meta.Kind, err, doc)
			}
		}
	}
	if n < 4 {
		t.Fatalf("found %d yaml documents in the guides; the check reads too little", n)
	}
}

func checkObject(apiVersion, kind string, doc []byte) error {
	switch {
	case apiVersion == skeinv1.GroupVersion.String() && kind == "AddressPool":
		var p skeinv1.AddressPool
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			return err
		}
		return webhook.ValidateCreate(&p, nil)
	case apiVersion == skeinv1.GroupVersion.String() && kind == "Egress":
		var e skeinv1.Egress
		if err := yaml.UnmarshalStrict(doc, &e); err != nil {
			return err
		}
		return webhook.ValidateEgress(&e, nil)
	case apiVersion == "v1" && kind == "Pod", apiVersion == "" && kind == "":
		// A Pod, or a fragment of one (metadata and spec of a pod a guide
		// asks the reader to complete).
		return yaml.UnmarshalStrict(doc, &corev1.Pod{})
	}
	return fmt.Errorf("a kind this check does not know: add it here")
}

var (
	flagRE   = regexp.MustCompile(`\[--([a-z0-9-]+)|\s--([a-z0-9-]+)`)
	makeRE   = regexp.MustCompile(`(?m)(?:^|\x60)make ([a-z][a-z0-9-]*)`)
	targetRE = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
)

// TestSkeindFlags: every --flag a guide shows in a line that runs skeind
// exists in the built skeind.
func TestSkeindFlags(t *testing.T) {
	bin := filepath.Join(skeintest.Binaries(t), "skeind")
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	if !bytes.Contains(help, []byte("--default-pool")) {
		t.Fatalf("skeind --help shows no flags:\n%s", help)
	}
	n := 0
	for _, b := range blocks(t) {
		for _, line := range strings.Split(b.text, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "skeind") && !strings.HasPrefix(line, "       [--") {
				continue
			}
			for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
				name := m[1] + m[2]
				n++
				if !bytes.Contains(help, []byte("--"+name+" ")) && !bytes.Contains(help, []byte("--"+name+"\n")) &&
					!bytes.Contains(help, []byte("--"+name+"=")) {
					t.Errorf("%s shows skeind --%s, which skeind does not have", b.file, name)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d skeind flags in the guides; the check reads too little", n)
	}
}

// TestMakeTargets: every `make X` in the guides is a target of the Makefile.
func TestMakeTargets(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, m := range targetRE.FindAllStringSubmatch(string(mk), -1) {
		targets = append(targets, m[1])
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range makeRE.FindAllStringSubmatch(string(b), -1) {
			n++
			if !slices.Contains(targets, m[1]) {
				rel, _ := filepath.Rel(root, f)
				t.Errorf("%s names `make %s`, which the Makefile does not have", rel, m[1])
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d make commands in the guides; the check reads too little", n)
	}
}

var (
	inlineCodeRE = regexp.MustCompile("`(skeinctl [^`]*)`")
	wordRE       = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// TestSkeinctlCommands: every skeinctl command a guide shows (in inline
// code or at the start of a line of an example block) names subcommands
// the built skeinctl has.
func TestSkeinctlCommands(t *testing.T) {
	bin := filepath.Join(skeintest.Binaries(t), "skeinctl")
	var shown []string
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range inlineCodeRE.FindAllStringSubmatch(string(b), -1) {
			shown = append(shown, m[1])
		}
	}
	for _, bl := range blocks(t) {
		for _, line := range strings.Split(bl.text, "\n") {
			if l := strings.TrimSpace(line); strings.HasPrefix(l, "skeinctl ") {
				shown = append(shown, l)
			}
		}
	}
	if len(shown) < 5 {
		t.Fatalf("found %d skeinctl commands in the guides; the check reads too little", len(shown))
	}
	help := func(path []string) (string, bool) {
		out, _ := exec.Command(bin, append(slices.Clone(path), "--help")...).CombinedOutput()
		return string(out), strings.Contains(string(out), "skeinctl "+strings.Join(path, " ")+" ") ||
			strings.Contains(string(out), "skeinctl "+strings.Join(path, " ")+"\n")
	}
	for _, cmd := range shown {
		var words []string
		for _, w := range strings.Fields(cmd)[1:] {
			if !wordRE.MatchString(w) {
				break
			}
			words = append(words, w)
		}
		// The longest prefix that is a command; the word after it may be
		// an argument only when that command has no subcommands.
		n := len(words)
		out, ok := help(words[:n])
		for ; n > 0 && !ok; n-- {
			out, ok = help(words[:n-1])
		}
		switch {
		case n == 0 || len(words) == 0:
			t.Errorf("the guides show `%s`: skeinctl has no command %q", cmd, strings.Join(words, " "))
		case n < len(words) && strings.Contains(out, "Available Commands:"):
			t.Errorf("the guides show `%s`: skeinctl %s has no subcommand %q", cmd, strings.Join(words[:n], " "), words[n])
		}
	}
}
