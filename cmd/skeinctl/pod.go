package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/skeinnet/skein/api/rpc"
)

// podTimeout is the default bound of pod attach and detach, which run
// plugins (each may take up to its network's timeout, 60 s by default).
const podTimeout = 5 * time.Minute

func (a *app) podCmd() *cobra.Command {
	cmd := groupCmd("pod", "Attach pods to the node's pod networks and detach them", "pods")
	cmd.AddCommand(a.podAttachCmd(), a.podDetachCmd(), a.podStatusCmd())
	return cmd
}

// podCallTimeout is --timeout when given, else podTimeout.
func (a *app) podCallTimeout(cmd *cobra.Command) time.Duration {
	if f := cmd.Flag("timeout"); f != nil && f.Changed {
		return a.timeout
	}
	return podTimeout
}

func (a *app) withPods(cmd *cobra.Command, timeout time.Duration, call func(context.Context, rpc.PodsClient) error) error {
	return a.withConn(cmd.Context(), timeout, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		return call(ctx, rpc.NewPodsClient(conn))
	})
}

// parseNetworkFlag parses NAME or NAME@IFNAME (skeind validates further).
func parseNetworkFlag(s string) (*rpc.PodNetwork, error) {
	name, ifname, has := strings.Cut(s, "@")
	if name == "" || has && ifname == "" {
		return nil, usagef("invalid --network %q: want NAME or NAME@IFNAME", s)
	}
	return &rpc.PodNetwork{Network: name, Ifname: ifname}, nil
}

func (a *app) podAttachCmd() *cobra.Command {
	var id, netns string
	var nets []string
	cmd := &cobra.Command{
		Use:   "attach --id UUID --netns PATH [--network NAME[@IFNAME]]...",
		Short: "Attach a pod to pod networks (default: the default networks)",
		Long: "Attach a pod, given by its UUID and its pinned network namespace, to the\n" +
			"networks named (in order; NAME@IFNAME picks the interface name), or to the\n" +
			"default networks. A pod already attached gets the new networks added. If\n" +
			"one fails, those added by this command are removed again, in reverse order.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" || netns == "" {
				return usagef("pod attach needs --id and --netns")
			}
			req := &rpc.PodAttachRequest{Id: id, Netns: netns}
			for _, n := range nets {
				pn, err := parseNetworkFlag(n)
				if err != nil {
					return err
				}
				req.Networks = append(req.Networks, pn)
			}
			var st *rpc.PodStatus
			err := a.withPods(cmd, a.podCallTimeout(cmd), func(ctx context.Context, c rpc.PodsClient) error {
				var err error
				st, err = c.Attach(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			return a.printPod(st)
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "the pod's `UUID`")
	f.StringVar(&netns, "netns", "", "`PATH` of the pod's pinned network namespace")
	f.StringArrayVar(&nets, "network", nil, "network to attach, `NAME[@IFNAME]`; repeat for more")
	return cmd
}

func (a *app) podDetachCmd() *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:   "detach --id UUID",
		Short: "Detach a pod from all its pod networks",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" {
				return usagef("pod detach needs --id")
			}
			return a.withPods(cmd, a.podCallTimeout(cmd), func(ctx context.Context, c rpc.PodsClient) error {
				_, err := c.Detach(ctx, &rpc.PodRef{Id: id})
				return err
			})
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the pod's `UUID`")
	return cmd
}

func (a *app) podStatusCmd() *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:   "status --id UUID",
		Short: "Show a pod's networks",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" {
				return usagef("pod status needs --id")
			}
			var st *rpc.PodStatus
			err := a.withPods(cmd, a.timeout, func(ctx context.Context, c rpc.PodsClient) error {
				var err error
				st, err = c.Status(ctx, &rpc.PodRef{Id: id})
				return err
			})
			if err != nil {
				return err
			}
			return a.printPod(st)
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the pod's `UUID`")
	return cmd
}

func (a *app) printPod(st *rpc.PodStatus) error {
	if a.output == "json" {
		return writeJSON(a.stdout, st)
	}
	now := a.now()
	t := newTable(a.stdout, "NETWORK", "IFNAME", "STATE", "ADDRESSES", "SOURCE", "AGE")
	for _, at := range st.GetAttachments() {
		src := at.GetImage()
		if src == "" {
			src = "pool " + at.GetPool()
		}
		state := at.GetState()
		if at.GetError() != "" {
			state += ": " + at.GetError()
		}
		t.row(at.GetNetwork(), at.GetIfname(), state, list(resultAddrs(at.GetResult())), src, age(at.GetCreated(), now))
	}
	for _, sk := range st.GetSkipped() {
		t.row(sk.GetNetwork(), "", "skipped: "+sk.GetError(), "", "", "")
	}
	return t.flush()
}

// resultAddrs lists the addresses of a CNI 1.x result.
func resultAddrs(result []byte) []string {
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if json.Unmarshal(result, &r) != nil {
		return []string{fmt.Sprintf("(%d bytes of result)", len(result))}
	}
	var out []string
	for _, ip := range r.IPs {
		out = append(out, ip.Address)
	}
	return out
}
