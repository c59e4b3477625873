package vm

import (
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/insomniacslk/dhcp/dhcpv4"
)

// The seed corpus under testdata/fuzz/FuzzConf is what libcni wrote on
// skein-vm's stdin for ADD and CHECK of a conflist chaining it after skein
// (recorded like internal/cni's seeds), the same with leaseSeconds, and
// conf_test.go's configuration chained after bridge and host-local.

// FuzzConf: skein-vm's configuration, as skeind's VM service takes it
// (ParseConf, then Leases). Nothing panics; refusals are spec errors; an
// accepted configuration encodes and parses back the same; every lease
// is one a VM can be served (an Ethernet MAC, at most one address per
// family, families consistent), and serving it works.
func FuzzConf(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConf(data, true)
		if err != nil {
			specErr(t, "ParseConf", err)
			return
		}
		enc, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("accepted configuration does not encode: %v", err)
		}
		back, err := ParseConf(enc, true)
		if err != nil {
			t.Fatalf("encoded configuration %s is refused: %v", enc, err)
		}
		nilEmptyConf(reflect.ValueOf(c).Elem())
		nilEmptyConf(reflect.ValueOf(back).Elem())
		if !reflect.DeepEqual(c, back) {
			t.Fatalf("round trip changed the configuration:\n in: %s\nenc: %s", data, enc)
		}

		leases, err := Leases(c, "vm-0")
		if err != nil {
			specErr(t, "Leases", err)
			return
		}
		if len(leases) == 0 {
			t.Fatal("Leases accepted a result with nothing to serve")
		}
		for _, l := range leases {
			checkLease(t, &l)
		}
	})
}

func checkLease(t *testing.T, l *Lease) {
	t.Helper()
	switch {
	case l.MAC != "" && len(l.HWAddr()) != 6:
		t.Fatalf("lease MAC %q", l.MAC)
	case !l.Addr4.IsValid() && !l.Addr6.IsValid():
		t.Fatalf("lease without an address: %+v", l)
	case l.Addr4.IsValid() && !l.Addr4.Addr().Is4(), l.Addr6.IsValid() && (!l.Addr6.Addr().Is6() || l.Addr6.Addr().Is4In6()):
		t.Fatalf("lease addresses of the wrong family: %+v", l)
	case l.Gateway4.IsValid() && !l.Gateway4.Is4(), l.Gateway6.IsValid() && !l.Gateway6.Is6():
		t.Fatalf("lease gateways of the wrong family: %+v", l)
	case l.Time <= 0:
		t.Fatalf("lease time %v", l.Time)
	}
	for _, r := range l.Routes4 {
		if !r.Dst.Addr().Is4() || r.Via.IsValid() && !r.Via.Is4() {
			t.Fatalf("IPv4 route %v", r)
		}
	}
	for _, r := range l.Routes6 {
		if !r.Dst.Addr().Is6() || r.Via.IsValid() && !r.Via.Is6() {
			t.Fatalf("IPv6 route %v", r)
		}
	}
	mac := l.HWAddr()
	if mac == nil {
		return // the VM service gives the VM a MAC of its own
	}
	if l.Addr4.IsValid() {
		req, err := dhcpv4.NewDiscovery(mac)
		if err != nil {
			t.Fatal(err)
		}
		rep, why := Answer4(l, req)
		if rep == nil {
			t.Fatalf("DISCOVER from the lease's MAC dropped: %s", why)
		}
		m, err := dhcpv4.FromBytes(rep.Msg.ToBytes())
		if err != nil || !m.YourIPAddr.Equal(l.Addr4.Addr().AsSlice()) {
			t.Fatalf("OFFER %v (%v), the lease is %s", m, err, l.Addr4)
		}
	}
	if l.Addr6.IsValid() {
		ll := LinkLocal(net.HardwareAddr{2, 0, 0, 0, 0, 1})
		src, _ := l.Router6(ll)
		fr, err := ParseFrame(BuildICMP6(brMAC, mac, src, allNodes, l.RouterAdvert(ll)), false)
		if err != nil || fr.Payload[0] != 134 {
			t.Fatalf("router advertisement %v: %v", fr, err)
		}
	}
}

func specErr(t *testing.T, what string, err error) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) || e.Code == 0 || e.Msg == "" {
		t.Fatalf("%s: %#v: want a spec error with a code and a message", what, err)
	}
}

// nilEmptyConf makes empty slices and maps nil, here and in what is
// pointed to: JSON does not tell `[]` from a field omitempty leaves out.
func nilEmptyConf(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			nilEmptyConf(v.Elem())
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				nilEmptyConf(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 && v.CanSet() {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if v.Kind() == reflect.Slice {
			for i := 0; i < v.Len(); i++ {
				nilEmptyConf(v.Index(i))
			}
		}
	}
}
