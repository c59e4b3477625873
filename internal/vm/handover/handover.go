// Package handover is the tap-FD handover protocol between skeind and a
// VM launcher (skein-vmwrapper): types, token files and the client. It uses
// only the standard library and x/sys so the launcher stays small.
//
// The launcher connects to skeind's VM socket (SOCK_SEQPACKET, default
// /run/skein/vm.sock, mode 0600: root only) and sends one Request naming
// the container and proving it may have its taps with the container's
// token. skeind answers with one Response whose ancillary data carries one
// open tap file descriptor per interface (SCM_RIGHTS), in the order of
// Response.Interfaces, and closes the connection once its own copies of
// the taps are closed (Fetch waits for that).
//
// The token is per container: HMAC-SHA256 of the container ID under a
// secret only skeind knows, hex-encoded. skeind writes it, at the first
// skein-vm ADD of a container, to <token dir>/<container ID> (default
// /run/skein/vm-tokens, directory 0700, file 0600, owner root) and removes
// it when the container's last VM attachment is deleted. It is never put
// in the CNI result: results are cached by runtimes and shown by tools.
// Whoever may read the file (root, or a launcher root hands it to) may
// have the container's taps; nobody else can, even with the socket.
//
// A launcher inside the VM's pod (qemu in the pod, as Kubernetes runs a
// VM) proves itself differently: it sends a Request with NetNS set and a
// descriptor of its own network namespace as ancillary data, and gets
// the taps of the attachments in that namespace. Having the namespace is
// the proof — a pod's containers share it, no other pod can open it — so
// such a pod needs the socket but neither the token directory nor its
// sandbox's container ID.
package handover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults.
const (
	DefaultSocket   = "/run/skein/vm.sock"
	DefaultTokenDir = "/run/skein/vm-tokens"
	// MaxInterfaces bounds the descriptors of one response.
	MaxInterfaces = 16
	// MaxMessage bounds a request or a response.
	MaxMessage = 64 << 10
)

// Request asks for the taps of one container.
type Request struct {
	ContainerID string `json:"containerID,omitempty"`
	Token       string `json:"token,omitempty"`
	// NetNS asks for the taps of the attachments in the network
	// namespace whose descriptor comes with the request (SCM_RIGHTS);
	// ContainerID and Token are then empty.
	NetNS bool `json:"netns,omitempty"`
}

// Interface describes one tap handed over: what the VM's NIC should be.
type Interface struct {
	Network string `json:"network"`
	// IfName is the main plugin's interface in the pod the tap stands for.
	IfName string `json:"ifName"`
	Tap    string `json:"tap"`
	// MAC is the VM NIC's address: the one the CNI result promised.
	MAC       string   `json:"mac"`
	MTU       int      `json:"mtu"`
	NetNS     string   `json:"netns"`
	Addresses []string `json:"addresses,omitempty"`
}

// Response answers a Request: interfaces (and as many descriptors), or
// an error.
type Response struct {
	Interfaces []Interface `json:"interfaces,omitempty"`
	Error      string      `json:"error,omitempty"`
}

// TokenPath is where skeind writes the token of containerID.
func TokenPath(dir, containerID string) string {
	return filepath.Join(dir, containerID)
}

// ReadToken reads the token of containerID from dir.
func ReadToken(dir, containerID string) (string, error) {
	if containerID == "" || strings.ContainsAny(containerID, "/\x00") || containerID == "." || containerID == ".." {
		return "", fmt.Errorf("container ID %q is not valid", containerID)
	}
	b, err := os.ReadFile(TokenPath(dir, containerID))
	if err != nil {
		return "", fmt.Errorf("read VM token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Fetch asks skeind at socket for the taps of containerID. The files are
// the open taps, in the order of the interfaces; the caller owns them.
func Fetch(socket, containerID, token string, timeout time.Duration) ([]Interface, []*os.File, error) {
	return fetch(socket, Request{ContainerID: containerID, Token: token}, nil, timeout)
}

// FetchOwn asks skeind at socket for the taps of the pod the caller is
// in: the calling thread's network namespace goes with the request.
func FetchOwn(socket string, timeout time.Duration) ([]Interface, []*os.File, error) {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, nil, fmt.Errorf("open own network namespace: %w", err)
	}
	defer ns.Close()
	return fetch(socket, Request{NetNS: true}, unix.UnixRights(int(ns.Fd())), timeout)
}

func fetch(socket string, r Request, rights []byte, timeout time.Duration) ([]Interface, []*os.File, error) {
	conn, err := net.DialTimeout("unixpacket", socket, timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to skeind at %s: %w", socket, err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(timeout))
	req, _ := json.Marshal(r)
	if _, _, err := uc.WriteMsgUnix(req, rights, nil); err != nil {
		return nil, nil, fmt.Errorf("send request: %w", err)
	}
	buf := make([]byte, MaxMessage)
	oob := make([]byte, unix.CmsgSpace(4*MaxInterfaces))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("read response: %w", err)
	}
	files, err := ParseRights(oob[:oobn])
	if err != nil {
		return nil, nil, err
	}
	var resp Response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		closeAll(files)
		return nil, nil, fmt.Errorf("decode response: %w", err)
	}
	if resp.Error != "" {
		closeAll(files)
		return nil, nil, errors.New("skeind: " + resp.Error)
	}
	if len(files) != len(resp.Interfaces) {
		closeAll(files)
		return nil, nil, fmt.Errorf("skeind sent %d descriptors for %d interfaces", len(files), len(resp.Interfaces))
	}
	// skeind closes the connection once it has closed its own copies of
	// the taps: wait for that, so that the taps are the caller's alone
	// (a tap takes one holder) when Fetch returns.
	if n, err := uc.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		closeAll(files)
		return nil, nil, fmt.Errorf("skeind did not end the hand-over (read %d bytes, %v)", n, err)
	}
	return resp.Interfaces, files, nil
}

// ParseRights returns the descriptors of SCM_RIGHTS control messages as
// files the caller owns.
func ParseRights(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("tap-fd-%d", fd)))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
