// Command plugin is the sandbox tests' network plugin: one static binary
// installed as /opt/network/add, /opt/network/del and /bin/main, its
// behaviour chosen by the "mode" of the config on stdin.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Mode   string `json:"mode"`
	Token  string `json:"token"`
	MS     int    `json:"ms"`
	N      int    `json:"n"`
	Secret string `json:"secret"`
	Pod    string `json:"pod"`
	Seq    int    `json:"seq"`
	Dir    string `json:"dir"`
	Probe  string `json:"probe"`
	MB     int    `json:"mb"`
}

const state = "/var/lib/network"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "grandchild" {
		// Lives until killed; its token is in its argv for the test to find.
		syscall.Setsid()
		sleepForever()
	}
	if len(os.Args) > 1 && os.Args[1] == "capeff" {
		capEff()
		return
	}
	if os.Getenv("MARK_AT_START") != "" {
		// Before anything else, stdin included: a side effect the moment
		// it runs.
		record("starts")
	}
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("read stdin: %v", err)
	}
	var c config
	if err := json.Unmarshal(raw, &c); err != nil {
		fail("parse config: %v", err)
	}
	switch c.Mode {
	case "ok":
		fmt.Fprintln(os.Stderr, "a log line on stderr")
		fmt.Printf(`{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24"}],"args":%q}`+"\n", strings.Join(os.Args[1:], " "))
	case "probe":
		probe(raw)
	case "hang":
		forkGrandchild(c.Token)
		fmt.Fprintln(os.Stderr, "hanging")
		sleepForever()
	case "crash":
		fmt.Fprintln(os.Stderr, "about to crash")
		var m map[string]int
		m["x"] = 1 // panics: assignment to entry in nil map
	case "cnierror":
		fmt.Println(`{"cniVersion":"1.1.0","code":11,"msg":"no addresses left","details":"pool p1"}`)
		fmt.Fprintln(os.Stderr, "giving up")
		os.Exit(1)
	case "garbage":
		os.Stdout.Write([]byte("this is \x00 not \xff json {{{\n"))
		os.Exit(c.N)
	case "stderr":
		line := strings.Repeat("e", 99) + "\n"
		for i := 0; i < 10000; i++ {
			os.Stderr.WriteString(line)
		}
		fmt.Fprintln(os.Stderr, "the last stderr line")
		fmt.Println(`{"cniVersion":"1.1.0"}`)
	case "bigout":
		chunk := strings.Repeat("o", 4096)
		for i := 0; i < 1024; i++ {
			if _, err := os.Stdout.WriteString(chunk); err != nil {
				os.Exit(3)
			}
		}
	case "sleep":
		sleepCounted(c)
	case "die-after":
		record("starts")
		time.Sleep(time.Duration(c.MS) * time.Millisecond)
		fmt.Fprintln(os.Stderr, "boom: main exec giving up")
		os.Exit(3)
	case "die-until":
		if n := record("starts"); n <= c.N {
			fmt.Fprintf(os.Stderr, "start %d fails\n", n)
			os.Exit(4)
		}
		sleepForever()
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		forkGrandchild(c.Token)
		record("starts")
		sleepForever()
	case "handle-term":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		record("starts")
		<-term
		record("term")
		os.Exit(0)
	case "watch":
		watch(c.Dir)
	case "hostile":
		hostile(c)
	default:
		fail("unknown mode %q", c.Mode)
	}
}

// sleepForever blocks without looking like a deadlock to the runtime.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

func fail(f string, a ...any) {
	fmt.Fprintf(os.Stderr, f+"\n", a...)
	os.Exit(1)
}

func forkGrandchild(token string) {
	self, err := os.Executable()
	if err != nil {
		fail("executable: %v", err)
	}
	cmd := exec.Command(self, "grandchild", token)
	if err := cmd.Start(); err != nil {
		fail("fork grandchild: %v", err)
	}
}

// record appends a start time to state/<name> and returns how many there are.
func record(name string) int {
	p := filepath.Join(state, name)
	f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail("record: %v", err)
	}
	fmt.Fprintln(f, time.Now().UnixNano())
	f.Close()
	b, _ := os.ReadFile(p)
	return strings.Count(string(b), "\n")
}

// sleepCounted marks itself running in state/running, notes how many calls
// run at once, logs its start and end to state/order-<pod>, and sleeps.
func sleepCounted(c config) {
	run := filepath.Join(state, "running")
	os.MkdirAll(run, 0o755)
	me := filepath.Join(run, fmt.Sprintf("%s-%d", c.Pod, c.Seq))
	if err := os.WriteFile(me, nil, 0o644); err != nil {
		fail("mark running: %v", err)
	}
	appendLine(filepath.Join(state, "order-"+c.Pod), "start "+strconv.Itoa(c.Seq))
	ents, _ := os.ReadDir(run)
	appendLine(filepath.Join(state, "concurrency"), strconv.Itoa(len(ents)))
	time.Sleep(time.Duration(c.MS) * time.Millisecond)
	appendLine(filepath.Join(state, "order-"+c.Pod), "end "+strconv.Itoa(c.Seq))
	os.Remove(me)
	fmt.Println(`{"cniVersion":"1.1.0"}`)
}

func appendLine(p, l string) {
	f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail("append %s: %v", p, err)
	}
	fmt.Fprintln(f, l)
	f.Close()
}

// probe reports what the sandbox looks like from inside, as JSON.
func probe(raw []byte) {
	var c config
	json.Unmarshal(raw, &c)
	r := map[string]any{"args": os.Args[1:], "env": os.Environ(), "pid": os.Getpid(), "config": string(raw)}
	errs := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	r["writeRoot"] = errs(os.WriteFile("/opt/network/written", []byte("x"), 0o644))
	r["mkdirRoot"] = errs(os.Mkdir("/newdir", 0o755))
	r["writeTmp"] = errs(os.WriteFile("/tmp/written", []byte("x"), 0o644))
	r["writeRun"] = errs(os.WriteFile("/run/written", []byte("x"), 0o644))
	r["writeState"] = errs(os.WriteFile(filepath.Join(state, "written-"+os.Args[2]), []byte("from the sandbox"), 0o644))
	r["writeSys"] = errs(os.Mkdir("/sys/kernel/skein-probe", 0o755))
	r["writeModules"] = errs(os.WriteFile("/lib/modules/written", []byte("x"), 0o644))
	r["writeDevNull"] = errs(os.WriteFile("/dev/null", []byte("x"), 0o644))
	if ents, err := os.ReadDir("/lib/modules"); err == nil {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		r["modules"] = names
	}
	var procs []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			procs = append(procs, e.Name())
		}
	}
	r["procs"] = procs
	if c.Secret != "" {
		_, err := os.Stat(c.Secret)
		r["secret"] = errs(err)
	}
	if len(os.Args) > 1 {
		r["writeNetNSDir"] = errs(os.WriteFile(filepath.Join(filepath.Dir(os.Args[1]), "written"), nil, 0o644))
		var st syscall.Stat_t
		if err := syscall.Stat(os.Args[1], &st); err != nil {
			r["netnsErr"] = err.Error()
		} else {
			r["netnsIno"] = st.Ino
			r["netnsDev"] = st.Dev
		}
		var fs syscall.Statfs_t
		if err := syscall.Statfs(os.Args[1], &fs); err == nil {
			r["netnsMagic"] = fs.Type
		}
	}
	var self syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err == nil {
		r["selfNetIno"] = self.Ino
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		var links []string
		for _, e := range ents {
			links = append(links, e.Name())
		}
		r["sysLinks"] = links
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	r["mountinfo"] = string(mounts)
	r["nice"] = niceOf("/proc/self/stat")
	r["fds"] = openFDs()
	json.NewEncoder(os.Stdout).Encode(r)
}

// openFDs lists this process's descriptors above stderr as "N -> target"
// (the listing's own left out): what it inherited, and what the Go runtime
// opened at start.
func openFDs() []string {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return []string{"open /proc/self/fd: " + err.Error()}
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []string
	for _, n := range names {
		if n == "0" || n == "1" || n == "2" || n == strconv.Itoa(int(d.Fd())) {
			continue
		}
		target, _ := os.Readlink("/proc/self/fd/" + n)
		out = append(out, n+" -> "+target)
	}
	return out
}

// niceOf is the nice value in a /proc stat file (field 19), or -100.
func niceOf(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -100
	}
	s := string(b)
	// The command name may hold spaces: count after its closing paren.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 17 {
		return -100
	}
	n, err := strconv.Atoi(f[16])
	if err != nil {
		return -100
	}
	return n
}

// watch writes, every 20 ms, which entries of dir are namespaces (on nsfs)
// to state/seen, one "name nsfs|other" per line.
func watch(dir string) {
	for {
		var b strings.Builder
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			var fs syscall.Statfs_t
			kind := "other"
			if syscall.Statfs(filepath.Join(dir, e.Name()), &fs) == nil && fs.Type == 0x6e736673 {
				kind = "nsfs"
			}
			fmt.Fprintf(&b, "%s %s\n", e.Name(), kind)
		}
		tmp := filepath.Join(state, "seen.tmp")
		os.WriteFile(tmp, []byte(b.String()), 0o644)
		os.Rename(tmp, filepath.Join(state, "seen"))
		time.Sleep(20 * time.Millisecond)
	}
}
