package routebench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

var flagOut = flag.String("out", "", "directory for datapath.json, convergence.json and report.md (empty: only logged)")

// writeResults writes v as name under -out and rewrites report.md from
// every results file there.
func writeResults(name string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if *flagOut == "" {
		fmt.Printf("%s:\n%s\n", name, js)
		return nil
	}
	if err := os.MkdirAll(*flagOut, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*flagOut, name), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return writeReport(*flagOut)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// command is the go test invocation that reproduces this run.
func command() string {
	var args []string
	flag.Visit(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "test.") {
			args = append(args, fmt.Sprintf("-%s %s", f.Name, f.Value))
		}
	})
	bench := "Routing"
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		bench = f.Value.String()
	}
	return fmt.Sprintf("go test -run '^$' -bench '%s' -benchtime 1x ./test/routebench/ -args %s", bench, strings.Join(args, " "))
}
