package cni

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
)

// TestEncodeResultAsLibrary: EncodeResult writes exactly what BuildResult
// and Encode (the CNI library's marshalling) write, for every version,
// with and without DNS and prevResult, for any strings.
func TestEncodeResultAsLibrary(t *testing.T) {
	confs := []string{
		`{"cniVersion":"%s","name":"n","type":"skein"}`,
		`{"cniVersion":"%s","name":"n","type":"skein","dns":{"nameservers":["10.0.0.10","fd00::a"],"domain":"cluster.local","search":["a.svc","b<&>"],"options":["ndots:5"]}}`,
		`{"cniVersion":"%s","name":"n","type":"skein","dns":{"search":["only"]}}`,
		`{"cniVersion":"%s","name":"n","type":"skein","prevResult":{"cniVersion":"%[1]s","interfaces":[{"name":"br0","mac":"02:00:00:00:00:09"}],"ips":[{"address":"10.9.0.2/24","interface":0}]}}`,
	}
	v4, v6 := netip.MustParseAddr("10.64.0.2"), netip.MustParseAddr("fd00:64::2")
	attached := []Attached{
		{HostName: "sk0123456789ab", HostMAC: "02:00:00:00:00:01", IfName: "eth0", ContainerMAC: "02:00:00:00:00:02", Sandbox: "/run/netns/p",
			Addrs: []netip.Addr{v4}, GatewayV4: netip.MustParseAddr("169.254.1.1")},
		{HostName: "sk0123456789ab", HostMAC: "02:00:00:00:00:01", IfName: "net1", ContainerMAC: "02:00:00:00:00:02", Sandbox: "/var/run/netns/<a&b>\u2028",
			Addrs: []netip.Addr{v4, v6}, GatewayV4: netip.MustParseAddr("169.254.1.1"), GatewayV6: netip.MustParseAddr("fe80::ff:fe00:1")},
		{HostName: "sk0123456789ab", IfName: "eth0", ContainerMAC: "02:00:00:00:00:02", Sandbox: "/proc/1/ns/\xff\xfenet é",
			Addrs: []netip.Addr{v6}, GatewayV6: netip.MustParseAddr("fe80::1")},
		{HostName: "sk0123456789ab", HostMAC: "02:00:00:00:00:01", IfName: "eth0", Sandbox: "",
			Addrs: []netip.Addr{v4, v6}, GatewayV4: netip.MustParseAddr("169.254.1.1")},
	}
	for _, ver := range SupportedVersions {
		for ci, tmpl := range confs {
			c, err := Parse([]byte(fmt.Sprintf(tmpl, ver)))
			if err != nil {
				continue // a prevResult older versions cannot hold
			}
			for ai, a := range attached {
				// Both twice on one configuration: neither may change it.
				BuildResult(c, a)
				EncodeResult(c, a)
				res, err := BuildResult(c, a)
				var want []byte
				if err == nil {
					want, err = Encode(res, c.CNIVersion)
				}
				got, gotErr := EncodeResult(c, a)
				if (err != nil) != (gotErr != nil) || !bytes.Equal(got, want) {
					t.Errorf("%s conf %d attached %d:\n got  %s (%v)\n want %s (%v)", ver, ci, ai, got, gotErr, want, err)
				}
			}
		}
	}
}

func BenchmarkEncodeResult(b *testing.B) {
	c, _ := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"skein"}`))
	a := Attached{HostName: "sk0123456789ab", HostMAC: "02:00:00:00:00:01", IfName: "eth0", ContainerMAC: "02:00:00:00:00:02",
		Sandbox: "/run/netns/p", Addrs: []netip.Addr{netip.MustParseAddr("10.64.0.2")}, GatewayV4: netip.MustParseAddr("169.254.1.1")}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			EncodeResult(c, a)
		}
	})
	b.Run("library", func(b *testing.B) {
		for b.Loop() {
			r, _ := BuildResult(c, a)
			Encode(r, c.CNIVersion)
		}
	})
}
