// Command plugin is the kurma tests' network plugin, installed as both
// /opt/network/add and /opt/network/del of a test image. Its add's
// behaviour is the "mode" of the config on stdin; it logs every call to
// /var/lib/network/log (the network's state directory) and its del leaves a
// marker file there, so tests can see which calls ran, in which order.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

type config struct {
	Main string `json:"main"`
	Name string `json:"name"`
	Mode string `json:"mode"`
	Addr string `json:"addr"`
	// DelMS makes del take this long (a slow del).
	DelMS int `json:"delMS"`
}

const state = "/var/lib/network"

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("read stdin: %v", err)
	}
	var c config
	if err := json.Unmarshal(raw, &c); err != nil {
		fail("parse config: %v", err)
	}
	if filepath.Base(os.Args[0]) == "main" {
		// The image's main exec: runs for the network's lifetime, or, with
		// "main":"die", fails at once (and again at every restart).
		logLine(fmt.Sprintf("%d main %s", time.Now().UnixNano(), c.Name))
		if c.Main == "die" {
			fail("main exec told to die")
		}
		if c.Main == "ignore-term" {
			// Like a C program's pause(): as PID 1 it never sees SIGTERM.
			signal.Ignore(syscall.SIGTERM)
		}
		for {
			time.Sleep(time.Hour)
		}
	}
	if len(os.Args) != 4 {
		fail("want 3 arguments (netns, uuid, ifname), got %q", os.Args[1:])
	}
	op := filepath.Base(os.Args[0])
	nsPath, uuid, ifname := os.Args[1], os.Args[2], os.Args[3]
	logLine(fmt.Sprintf("%d %s %s %s %s", time.Now().UnixNano(), op, c.Name, uuid, ifname))
	switch op {
	case "del":
		time.Sleep(time.Duration(c.DelMS) * time.Millisecond)
		if _, err := os.Stat(nsPath); err == nil && ifname != "" {
			// (a gone namespace took its links with it)
			if err := withLinks(nsPath, func(h *netlink.Handle) error {
				l, err := h.LinkByName(ifname)
				if err != nil {
					return nil // already gone: del is idempotent
				}
				return h.LinkDel(l)
			}); err != nil {
				fail("del link: %v", err)
			}
		}
		if err := os.WriteFile(filepath.Join(state, "del-"+uuid+"-"+ifname), nil, 0o644); err != nil {
			fail("marker: %v", err)
		}
		return
	case "add":
	default:
		fail("called as %q", op)
	}
	// Every add makes its interface first (a bridge: this kernel has no
	// dummy driver), so a failure after it leaves something to undo.
	if ifname != "" {
		if err := withLinks(nsPath, func(h *netlink.Handle) error {
			return h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: ifname}})
		}); err != nil {
			fail("add link %s: %v", ifname, err)
		}
	}
	switch c.Mode {
	case "ok", "":
		fmt.Printf(`{"cniVersion":"1.1.0","interfaces":[{"name":%q,"sandbox":%q}],"ips":[{"address":%q,"interface":0}]}`+"\n", ifname, nsPath, c.Addr)
	case "old":
		// Kurma's document: no cniVersion, one address per family.
		fmt.Printf(`{"ip4":{"ip":%q}}`+"\n", c.Addr)
	case "stderr":
		for i := range 200 {
			fmt.Fprintf(os.Stderr, "log line %d of a chatty plugin\n", i)
		}
		fmt.Printf(`{"cniVersion":"0.4.0","ips":[{"version":"4","address":%q}]}`+"\n", c.Addr)
	case "garbage":
		fmt.Println("starting up... done")
		fmt.Println(`{"cniVersion":"1.1.0"}`)
	case "crash":
		panic("plugin crashed on purpose")
	case "fail":
		fmt.Println(`{"cniVersion":"1.1.0","code":11,"msg":"try again later"}`)
		os.Exit(1)
	case "hang":
		for {
			time.Sleep(time.Hour)
		}
	default:
		fail("unknown mode %q", c.Mode)
	}
}

func withLinks(path string, f func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

func logLine(l string) {
	f, err := os.OpenFile(filepath.Join(state, "log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail("log: %v", err)
	}
	defer f.Close()
	fmt.Fprintln(f, strings.TrimSpace(l))
}

func fail(f string, a ...any) {
	fmt.Fprintf(os.Stderr, f+"\n", a...)
	os.Exit(1)
}
