package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
)

// parseTable splits tabular output into rows of cells. Columns are separated
// by three or more spaces, and every cell must start exactly under its
// header, which is what makes the table readable.
func parseTable(t *testing.T, out string) [][]string {
	t.Helper()
	sep := regexp.MustCompile(` {3,}`)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	starts := sep.FindAllStringIndex(header, -1)
	var rows [][]string
	for _, line := range lines {
		cells := sep.Split(strings.TrimRight(line, " "), -1)
		for i, loc := range sep.FindAllStringIndex(line, -1) {
			if i < len(starts) && loc[1] != starts[i][1] {
				t.Errorf("column %d of %q starts at %d, header's at %d\n%s", i+1, line, loc[1], starts[i][1], out)
			}
		}
		rows = append(rows, cells)
	}
	return rows
}

func TestTables(t *testing.T) {
	sock := serve(t, cannedAdmin())
	tests := []struct {
		name string
		args []string
		want [][]string
	}{{
		name: "pool list",
		args: []string{"pool", "list"},
		want: [][]string{
			{"NAME", "SUBNETS", "BLOCK-BITS", "BLOCKS", "USED", "CAPACITY"},
			{"default", "10.88.0.0/16", "5", "2", "3", "65533"},
			{"dual", "10.99.0.0/24, fd99::/48", "6", "1", "1", "254 v4, ~2^64 v6"},
		},
	}, {
		name: "block list",
		args: []string{"block", "list"},
		want: [][]string{
			{"POOL", "INDEX", "NODE", "IPV4", "IPV6", "USED", "SIZE"},
			{"default", "0", "node-a", "10.88.0.0/27", "-", "2", "32"},
			{"default", "1", "node-a", "10.88.0.32/27", "-", "1", "32"},
			{"dual", "0", "node-a", "10.99.0.0/26", "fd99::/122", "1", "64"},
		},
	}, {
		name: "block list of one pool",
		args: []string{"block", "list", "--pool", "dual"},
		want: [][]string{
			{"POOL", "INDEX", "NODE", "IPV4", "IPV6", "USED", "SIZE"},
			{"dual", "0", "node-a", "10.99.0.0/26", "fd99::/122", "1", "64"},
		},
	}, {
		name: "attachment list",
		args: []string{"attachment", "list"},
		want: [][]string{
			{"NETWORK", "CONTAINER", "IFNAME", "POOL", "ADDRESSES", "HOST-LINK", "OWNER", "AGE"},
			{"skein0", "3f1c9a2b7d4e", "eth0", "default", "10.88.0.2/16", "sk3f1c9a2b", "cni", "3h"},
			{"skein0", "3f1c9a2b7d4e", "eth1", "dual", "10.99.0.2/24, fd99::2/48", "sk3f1c9a2c", "cni", "90s"},
			{"backend", "9b8a7c6d5e4f", "eth0", "default", "10.88.0.34/16", "-", "docker", "2d"},
			{"backend", "9b8a00000000", "eth0", "default", "10.88.0.3/16", "-", "docker", "-"},
		},
	}, {
		name: "attachment list filtered",
		args: []string{"attachments", "ls", "--network", "skein0", "--pool", "dual"},
		want: [][]string{
			{"NETWORK", "CONTAINER", "IFNAME", "POOL", "ADDRESSES", "HOST-LINK", "OWNER", "AGE"},
			{"skein0", "3f1c9a2b7d4e", "eth1", "dual", "10.99.0.2/24, fd99::2/48", "sk3f1c9a2c", "cni", "90s"},
		},
	}, {
		name: "route list",
		args: []string{"route", "list"},
		want: [][]string{
			{"BLOCK", "NODE", "NODE-ADDRESS", "MODE", "VIA", "INSTALLED", "REASON"},
			{"10.88.0.64/27", "node-b", "192.0.2.2, 2001:db8::2", "direct", "192.0.2.2", "yes", "-"},
			{"10.88.0.96/27", "node-c", "198.51.100.3", "direct", "-", "no", "node address 198.51.100.3 is not on a directly connected network"},
		},
	}, {
		name: "empty list keeps its header",
		args: []string{"attachment", "list", "--network", "nope"},
		want: [][]string{
			{"NETWORK", "CONTAINER", "IFNAME", "POOL", "ADDRESSES", "HOST-LINK", "OWNER", "AGE"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := cli(nil, append([]string{"--socket", sock}, tt.args...)...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			got := parseTable(t, out)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got rows\n%q\nwant\n%q\noutput:\n%s", got, tt.want, out)
			}
		})
	}
}

func TestDetails(t *testing.T) {
	sock := serve(t, cannedAdmin())
	tests := []struct {
		name string
		args []string
		want []string // lines, spaces collapsed
	}{{
		name: "pool show",
		args: []string{"pool", "show", "dual"},
		want: []string{
			"Name: dual",
			"Subnets: 10.99.0.0/24, fd99::/48",
			"Block bits: 6",
			"Reserved: -",
			"Blocks: 1",
			"Used: 1",
			"Capacity: 254 v4, ~2^64 v6",
		},
	}, {
		name: "pool create prints the stored pool",
		args: []string{"pool", "create", "new", "--subnet", "10.1.0.0/16"},
		want: []string{"Name: new", "Subnets: 10.1.0.0/16", "Block bits: 5", "Reserved: -", "Blocks: 0", "Used: 0", "Capacity: 0"},
	}, {
		name: "pool delete",
		args: []string{"pool", "rm", "default"},
		want: []string{`pool "default" deleted`},
	}, {
		name: "status",
		args: []string{"status"},
		want: []string{
			"Version: v0.1.0",
			"Node: node-a",
			"Store: bbolt /var/lib/skein/skein.db",
			"Uptime: 3h2m1s",
			"Attachments: 4",
			"",
			"POOL SUBNETS USED FREE",
			"default 10.88.0.0/16 3 65530",
			"dual 10.99.0.0/24, fd99::/48 1 ~2^64",
		},
	}, {
		name: "attachment show by prefix",
		args: []string{"attachment", "show", ctrA[:12]},
		want: []string{
			"Container: " + ctrA,
			"Network: skein0",
			"Interface: eth0",
			"MAC: 02:42:0a:58:00:02",
			"Netns: /var/run/netns/a",
			"Pool: default",
			"Addresses: 10.88.0.2/16",
			"Host link: sk3f1c9a2b",
			"Owner: cni",
			"Created: " + cannedAdmin().attachments[0].Created + " (3h ago)",
			"",
			"Container: " + ctrA,
			"Network: skein0",
			"Interface: eth1",
			"MAC: -",
			"Netns: -",
			"Pool: dual",
			"Addresses: 10.99.0.2/24, fd99::2/48",
			"Host link: sk3f1c9a2c",
			"Owner: cni",
			"Created: " + cannedAdmin().attachments[1].Created + " (90s ago)",
		},
	}, {
		name: "attachment show by full ID",
		args: []string{"attachment", "show", ctrC},
		want: []string{"Container: " + ctrC, "Network: backend", "Interface: eth0", "MAC: -", "Netns: -",
			"Pool: default", "Addresses: 10.88.0.3/16", "Host link: -", "Owner: docker", "Created: -"},
	}}
	spaces := regexp.MustCompile(` +`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := cli(nil, append([]string{"--socket", sock}, tt.args...)...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			got := strings.Split(spaces.ReplaceAllString(strings.TrimRight(out, "\n"), " "), "\n")
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestJSON(t *testing.T) {
	f := cannedAdmin()
	sock := serve(t, f)
	tests := []struct {
		name string
		args []string
		want any // proto.Message for one object, []proto.Message for an array
		new  func() proto.Message
	}{
		{"pool list", []string{"pool", "list"}, msgs(f.pools), func() proto.Message { return &rpc.Pool{} }},
		{"pool show", []string{"pool", "show", "default"}, f.pools[0], func() proto.Message { return &rpc.Pool{} }},
		{"pool delete", []string{"pool", "delete", "dual"}, &rpc.PoolRef{Name: "dual"}, func() proto.Message { return &rpc.PoolRef{} }},
		{"block list", []string{"block", "list", "--pool", "default"}, msgs(f.blocks[:2]), func() proto.Message { return &rpc.Block{} }},
		{"attachment list", []string{"attachment", "list"}, msgs(f.attachments), func() proto.Message { return &rpc.Attachment{} }},
		{"attachment list empty", []string{"attachment", "list", "--pool", "none"}, []proto.Message{}, func() proto.Message { return &rpc.Attachment{} }},
		{"attachment show", []string{"attachment", "show", ctrB[:12]}, msgs(f.attachments[2:3]), func() proto.Message { return &rpc.Attachment{} }},
		{"route list", []string{"route", "list"}, msgs(f.routes.Routes), func() proto.Message { return &rpc.Route{} }},
		{"status", []string{"status"}, f.status, func() proto.Message { return &rpc.DaemonStatus{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := cli(nil, append([]string{"--socket", sock, "-o", "json"}, tt.args...)...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			switch want := tt.want.(type) {
			case proto.Message:
				got := tt.new()
				if err := protojson.Unmarshal([]byte(out), got); err != nil {
					t.Fatalf("output is not one %T: %v\n%s", got, err, out)
				}
				if !proto.Equal(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			case []proto.Message:
				var raw []json.RawMessage
				if err := json.Unmarshal([]byte(out), &raw); err != nil || raw == nil {
					t.Fatalf("output is not a JSON array (%v):\n%s", err, out)
				}
				if len(raw) != len(want) {
					t.Fatalf("got %d objects, want %d:\n%s", len(raw), len(want), out)
				}
				for i, r := range raw {
					got := tt.new()
					if err := protojson.Unmarshal(r, got); err != nil {
						t.Fatalf("element %d: %v", i, err)
					}
					if !proto.Equal(got, want[i]) {
						t.Errorf("element %d: got %v, want %v", i, got, want[i])
					}
				}
			}
		})
	}
}

func msgs[M proto.Message](ms []M) []proto.Message {
	out := make([]proto.Message, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

// TestJSONStable pins the exact shape scripts see: camelCase names, zero
// values present, 64-bit numbers as strings.
func TestJSONStable(t *testing.T) {
	sock := serve(t, cannedAdmin())
	out, _, code := cli(nil, "--socket", sock, "-o", "json", "pool", "show", "default")
	want := `{
  "name": "default",
  "subnets": [
    "10.88.0.0/16"
  ],
  "blockSizeBits": 5,
  "reserved": [
    "10.88.0.1"
  ],
  "capacityV4": "65533",
  "capacityV6": "0",
  "used": "3",
  "blocks": 2
}
`
	if code != 0 || out != want {
		t.Errorf("exit %d, got\n%s\nwant\n%s", code, out, want)
	}
}

// TestRequests checks that flags reach skeind as the right request fields.
func TestRequests(t *testing.T) {
	f := cannedAdmin()
	sock := serve(t, f)
	tests := []struct {
		name string
		args []string
		want []proto.Message
	}{{
		name: "pool create with defaults leaves block bits to skeind",
		args: []string{"pool", "create", "p", "--subnet", "10.0.0.0/24"},
		want: []proto.Message{&rpc.Pool{Name: "p", Subnets: []string{"10.0.0.0/24"}}},
	}, {
		name: "pool create with every flag",
		args: []string{"pool", "create", "p", "--subnet", "10.0.0.0/16", "--subnet", "fd00::/48",
			"--block-size-bits", "7", "--reserve", "10.0.0.1", "--reserve", "10.0.0.0/30",
			"--reserve", "10.0.1.10-10.0.1.20"},
		want: []proto.Message{&rpc.Pool{Name: "p", Subnets: []string{"10.0.0.0/16", "fd00::/48"}, BlockSizeBits: 7,
			Reserved: []string{"10.0.0.1", "10.0.0.0/30", "10.0.1.10-10.0.1.20"}}},
	}, {
		name: "comma-separated values split",
		args: []string{"pool", "create", "p", "--subnet", "10.0.0.0/16,fd00::/48", "--reserve", "10.0.0.1,10.0.0.2"},
		want: []proto.Message{&rpc.Pool{Name: "p", Subnets: []string{"10.0.0.0/16", "fd00::/48"},
			Reserved: []string{"10.0.0.1", "10.0.0.2"}}},
	}, {
		name: "pool show",
		args: []string{"pool", "show", "default"},
		want: []proto.Message{&rpc.PoolRef{Name: "default"}},
	}, {
		name: "pool delete",
		args: []string{"pool", "delete", "default"},
		want: []proto.Message{&rpc.PoolRef{Name: "default"}},
	}, {
		name: "block list",
		args: []string{"block", "list", "--pool", "dual"},
		want: []proto.Message{&rpc.BlockFilter{Pool: "dual"}},
	}, {
		name: "attachment list",
		args: []string{"attachment", "list", "--network", "n", "--pool", "p", "--container", "c"},
		want: []proto.Message{&rpc.AttachmentFilter{Network: "n", Pool: "p", ContainerId: "c"}},
	}, {
		name: "attachment show by full ID asks once",
		args: []string{"attachment", "show", ctrA},
		want: []proto.Message{&rpc.AttachmentFilter{ContainerId: ctrA}},
	}, {
		name: "attachment show by prefix falls back to the full list",
		args: []string{"attachment", "show", "3f1c"},
		want: []proto.Message{&rpc.AttachmentFilter{ContainerId: "3f1c"}, &rpc.AttachmentFilter{}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.requests()
			_, errOut, code := cli(nil, append([]string{"--socket", sock}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			got := f.requests()
			if len(got) != len(tt.want) {
				t.Fatalf("got requests %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Errorf("request %d: got %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	f := cannedAdmin()
	f.errs = map[string]error{
		"DeletePool": status.Error(codes.FailedPrecondition, `pool "p" is in use by 2 attachments: skein0/3f1c9a2b7d4e/eth0, skein0/3f1c9a2b7d4e/eth1`),
		"CreatePool": status.Error(codes.InvalidArgument, `subnet "10.0.0.0/33": invalid CIDR`),
		"ListPools":  status.Error(codes.Unavailable, "store is still opening"),
	}
	sock := serve(t, f)
	hung := cannedAdmin()
	hung.hang = true
	hungSock := serve(t, hung)
	missing := t.TempDir() + "/nothing.sock"

	tests := []struct {
		name     string
		args     []string
		wantErr  string // first line of stderr
		wantCode int
	}{
		{"daemon refuses delete", []string{"pool", "delete", "p"},
			`skeinctl: pool "p" is in use by 2 attachments: skein0/3f1c9a2b7d4e/eth0, skein0/3f1c9a2b7d4e/eth1`, 1},
		{"daemon rejects pool", []string{"pool", "create", "p", "--subnet", "10.0.0.0/33"},
			`skeinctl: subnet "10.0.0.0/33": invalid CIDR`, 1},
		{"not found", []string{"pool", "show", "nope"}, `skeinctl: pool "nope" not found`, 1},
		{"unavailable from a running daemon keeps its message", []string{"pool", "list"},
			"skeinctl: store is still opening", 1},
		{"no daemon", []string{"--socket", missing, "status"},
			"skeinctl: cannot reach skeind at " + missing + ": is it running?", 1},
		{"timeout", []string{"--socket", hungSock, "--timeout", "100ms", "status"},
			"skeinctl: skeind at " + hungSock + " did not answer within 100ms", 1},
		{"no attachments", []string{"attachment", "show", "ffff"}, `skeinctl: no attachments for container "ffff"`, 1},
		{"ambiguous prefix", []string{"attachment", "show", "9b8a"},
			`skeinctl: container ID prefix "9b8a" is ambiguous: it matches ` + ctrB + ", " + ctrC, 1},

		{"unknown command", []string{"frobnicate"}, `skeinctl: unknown command "frobnicate" for "skeinctl"`, 2},
		{"unknown subcommand", []string{"pool", "frobnicate"}, `skeinctl: unknown command "frobnicate" for "skeinctl pool"`, 2},
		{"unknown flag", []string{"pool", "list", "--bogus"}, "skeinctl: unknown flag: --bogus", 2},
		{"missing name", []string{"pool", "show"}, `skeinctl: "skeinctl pool show" requires NAME`, 2},
		{"extra argument", []string{"pool", "delete", "a", "b"},
			`skeinctl: "skeinctl pool delete" takes only NAME, got extra argument "b"`, 2},
		{"arguments to a list", []string{"block", "list", "x"}, `skeinctl: "skeinctl block list" takes no arguments, got "x"`, 2},
		{"missing subnet", []string{"pool", "create", "p"}, "skeinctl: pool create: at least one --subnet is required", 2},
		{"bad block bits", []string{"pool", "create", "p", "--subnet", "10.0.0.0/8", "--block-size-bits", "-1"},
			`skeinctl: invalid argument "-1" for "--block-size-bits" flag: strconv.ParseUint: parsing "-1": invalid syntax`, 2},
		{"bad output", []string{"-o", "yaml", "status"}, `skeinctl: invalid --output "yaml": want table or json`, 2},
		{"bad timeout", []string{"--timeout", "0s", "status"}, "skeinctl: invalid --timeout 0s: must be positive", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := cli(nil, append([]string{"--socket", sock}, tt.args...)...)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d", code, tt.wantCode)
			}
			if first, _, _ := strings.Cut(errOut, "\n"); first != tt.wantErr {
				t.Errorf("stderr %q, want first line %q", errOut, tt.wantErr)
			}
			if code == 2 && !strings.Contains(errOut, "--help' for usage.") {
				t.Errorf("usage error without a hint: %q", errOut)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
		})
	}
}

func TestSocket(t *testing.T) {
	sock := serve(t, cannedAdmin())
	missing := t.TempDir() + "/nothing.sock"
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // socket in the error, or "" for success
	}{
		{"default", nil, nil, defaultSocket},
		{"env", map[string]string{"SKEIN_SOCKET": sock}, nil, ""},
		{"flag beats env", map[string]string{"SKEIN_SOCKET": sock}, []string{"--socket", missing}, missing},
		{"flag", nil, []string{"--socket", sock}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == defaultSocket && probe(defaultSocket) == nil {
				t.Skip("a skeind is running on this machine")
			}
			_, errOut, code := cli(tt.env, append(tt.args, "status")...)
			if tt.want == "" {
				if code != 0 {
					t.Errorf("exit %d, stderr %q", code, errOut)
				}
				return
			}
			if want := "cannot reach skeind at " + tt.want + ":"; code != 1 || !strings.Contains(errOut, want) {
				t.Errorf("exit %d, stderr %q, want %q", code, errOut, want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"pool"}, {"pool", "create", "--help"}} {
		out, errOut, code := cli(nil, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "Usage:") {
			t.Errorf("%q: exit %d, stderr %q, stdout %q", args, code, errOut, out)
		}
	}
}

func TestCount(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0"}, {254, "254"}, {1 << 32, "4294967296"}, {1<<32 + 1, "~2^32"},
		{1<<64 - 1, "~2^64"}, {1 << 63, "~2^63"}, {1<<63 + 1<<62, "~2^64"}, {1<<63 + 1<<61, "~2^63"},
	}
	for _, tt := range tests {
		if got := count(tt.n); got != tt.want {
			t.Errorf("count(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestFree(t *testing.T) {
	tests := []struct{ v4, v6, used, want uint64 }{
		{254, 0, 4, 250},
		{254, 0, 300, 0},
		{1<<64 - 1, 1 << 10, 5, 1<<64 - 1 - 5},
	}
	for _, tt := range tests {
		if got := free(tt.v4, tt.v6, tt.used); got != tt.want {
			t.Errorf("free(%d, %d, %d) = %d, want %d", tt.v4, tt.v6, tt.used, got, tt.want)
		}
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		ago  time.Duration
		want string
	}{
		{-time.Minute, "0s"}, {0, "0s"}, {119 * time.Second, "119s"}, {2 * time.Minute, "2m"},
		{119 * time.Minute, "119m"}, {2 * time.Hour, "2h"}, {47 * time.Hour, "47h"},
		{48 * time.Hour, "2d"}, {729 * 24 * time.Hour, "729d"}, {3 * 365 * 24 * time.Hour, "3y"},
	}
	for _, tt := range tests {
		if got := age(now.Add(-tt.ago).Format(time.RFC3339), now); got != tt.want {
			t.Errorf("age(%s ago) = %q, want %q", tt.ago, got, tt.want)
		}
	}
	if got := age("yesterday", now); got != "?" {
		t.Errorf("age of a bad timestamp = %q, want ?", got)
	}
	if got := age("", now); got != "" {
		t.Errorf("age of no timestamp = %q, want empty", got)
	}
}

// TestRouteListAsksSkeind: routes are the node's, so route list asks
// skeind even with $KUBECONFIG set, and refuses an explicit --kubeconfig.
func TestRouteListAsksSkeind(t *testing.T) {
	f := cannedAdmin()
	sock := serve(t, f)
	out, errOut, code := cli(map[string]string{"SKEIN_SOCKET": sock, "KUBECONFIG": "/nonexistent"}, "route", "list")
	if code != 0 || !strings.Contains(out, "node-b") {
		t.Errorf("route list with $KUBECONFIG: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, errOut, code = cli(nil, "--socket", sock, "--kubeconfig", "/x", "route", "list")
	if code != 2 || !strings.Contains(errOut, "--kubeconfig does not apply") {
		t.Errorf("route list --kubeconfig: exit %d, stderr %q; want a usage error", code, errOut)
	}
	f.errs = map[string]error{"ListRoutes": status.Error(codes.Unavailable, "down")}
	_, errOut, code = cli(nil, "--socket", sock, "route", "list")
	if code == 0 || !strings.Contains(errOut, "down") {
		t.Errorf("route list failing: exit %d, stderr %q", code, errOut)
	}
}
