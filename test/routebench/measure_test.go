package routebench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// iperfServer runs `iperf3 -s` inside ns until the end of the test. It
// listens on every address of the namespace, so one server serves every
// row whose far end is that namespace.
func iperfServer(t testing.TB, ns *harness.NS) {
	t.Helper()
	var cmd *exec.Cmd
	err := ns.Do(func() error {
		cmd = exec.Command("iperf3", "-s")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd.Start()
	})
	if err != nil {
		t.Fatalf("iperf3 -s in %s: %v", ns.Name(), err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// iperfClient runs one TCP test of secs seconds (the first one omitted as
// slow start) from ns to addr and returns what the receiver got, in
// Gbit/s. It retries for a few seconds while the server is not up yet.
func iperfClient(t testing.TB, ns *harness.NS, addr netip.Addr, secs int) (float64, error) {
	t.Helper()
	var (
		out []byte
		err error
	)
	for try := 0; try < 20; try++ {
		err = ns.Do(func() error {
			var e error
			out, e = exec.Command("iperf3", "-c", addr.String(), "-t", strconv.Itoa(secs), "-O", "1", "-J").Output()
			return e
		})
		if err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return 0, fmt.Errorf("iperf3 -c %s from %s: %w: %s", addr, ns.Name(), err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("iperf3 output: %w", err)
	}
	if r.Error != "" || r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 -c %s from %s: %q, %g bit/s", addr, ns.Name(), r.Error, r.End.SumReceived.BitsPerSecond)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, nil
}

// rrPort is the TCP port of the ping-pong server.
const rrPort = 7777

// rrMsg is the size of one request and of one response.
const rrMsg = 64

// rrServer listens on rrPort in ns and echoes every rrMsg bytes it reads,
// one connection at a time, until the end of the test. Its sockets are
// blocking and its goroutine stays in read/write system calls, so that a
// round trip costs the kernel's path plus two wake-ups, without Go's
// network poller in between (as netperf TCP_RR measures).
func rrServer(t testing.TB, ns *harness.NS) {
	t.Helper()
	var lfd int
	err := ns.Do(func() error {
		var err error
		if lfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: rrPort}); err != nil {
			return err
		}
		return unix.Listen(lfd, 8)
	})
	if err != nil {
		t.Fatalf("ping-pong server in %s: %v", ns.Name(), err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		// shutdown wakes the blocked accept; the goroutine closes lfd.
		_ = unix.Shutdown(lfd, unix.SHUT_RDWR)
		<-done
	})
	go func() {
		defer close(done)
		defer unix.Close(lfd)
		buf := make([]byte, rrMsg)
		for {
			fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if err != nil {
				if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
					continue
				}
				return
			}
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
			for readFull(fd, buf) == nil && writeFull(fd, buf) == nil {
			}
			unix.Close(fd)
		}
	}()
}

// rrLatency connects from ns to addr's ping-pong server and makes round
// trips of rrMsg bytes each way for d (after a warm-up of 500), returning
// every round trip's duration.
func rrLatency(ns *harness.NS, addr netip.Addr, d time.Duration) ([]time.Duration, error) {
	var fd int
	var err error
	for try := 0; try < 20; try++ {
		err = ns.Do(func() error {
			var e error
			if fd, e = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); e != nil {
				return e
			}
			if e = unix.Connect(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: rrPort}); e != nil {
				unix.Close(fd)
			}
			return e
		})
		if err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to %s:%d from %s: %w", addr, rrPort, ns.Name(), err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return nil, err
	}
	buf := make([]byte, rrMsg)
	rtts := make([]time.Duration, 0, 1<<16)
	var end time.Time
	for i := 0; ; i++ {
		if i == 500 {
			end = time.Now().Add(d)
		}
		start := time.Now()
		if err := writeFull(fd, buf); err != nil {
			return nil, fmt.Errorf("ping-pong to %s: %w", addr, err)
		}
		if err := readFull(fd, buf); err != nil {
			return nil, fmt.Errorf("ping-pong to %s: %w", addr, err)
		}
		now := time.Now()
		if i >= 500 {
			rtts = append(rtts, now.Sub(start))
			if now.After(end) {
				return rtts, nil
			}
		}
	}
}

func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("connection closed")
		}
		b = b[n:]
	}
	return nil
}

func writeFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// pctl is the p-th percentile (nearest rank) of ds in microseconds.
func pctl(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i].Nanoseconds()) / 1e3
}

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
