package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/skeinnet/skein/api/rpc"
)

func (a *app) routeCmd() *cobra.Command {
	cmd := groupCmd("route", "Inspect this node's routes to other nodes' blocks", "routes")
	cmd.AddCommand(a.routeListCmd())
	return cmd
}

func (a *app) routeListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List other nodes' blocks and whether this node routes them",
		Long: "List every block of another node (one line per address family) with\n" +
			"its node, the node's address, the routing mode (skeind --routing), the\n" +
			"next hop, and whether the route is installed (else why not), as of\n" +
			"skeind's last sync. In export mode \"installed\" means a routing daemon\n" +
			"(BIRD) has put the block's route into the kernel, checked at the time\n" +
			"of the request. Always asks this\n" +
			"node's skeind; with the embedded store the list is empty.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.kubeconfig != "" {
				return usagef("route list asks this node's skeind over --socket; --kubeconfig does not apply")
			}
			var l *rpc.RouteList
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				var err error
				l, err = c.ListRoutes(ctx, &rpc.Empty{})
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSONList(a.stdout, l.GetRoutes())
			}
			t := newTable(a.stdout, "BLOCK", "NODE", "NODE-ADDRESS", "MODE", "VIA", "INSTALLED", "REASON")
			for _, r := range l.GetRoutes() {
				installed := "no"
				if r.GetInstalled() {
					installed = "yes"
				}
				t.row(r.GetBlock(), r.GetNode(), list(r.GetNodeAddresses()), r.GetMode(), r.GetVia(), installed, r.GetReason())
			}
			return t.flush()
		},
	}
}
