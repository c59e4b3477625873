package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/skeinnet/skein/api/rpc"
)

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the state of this node's skeind",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st *rpc.DaemonStatus
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				var err error
				st, err = c.Status(ctx, &rpc.Empty{})
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSON(a.stdout, st)
			}
			d := newDetails(a.stdout)
			d.field("Version", st.GetVersion())
			d.field("Node", st.GetNode())
			d.field("Store", st.GetStore())
			d.field("Uptime", st.GetUptime())
			d.field("Attachments", itoa(st.GetAttachments()))
			if err := d.flush(); err != nil {
				return err
			}
			if len(st.GetPools()) == 0 {
				_, err := fmt.Fprintln(a.stdout, "\nNo pools.")
				return err
			}
			fmt.Fprintln(a.stdout)
			t := newTable(a.stdout, "POOL", "SUBNETS", "USED", "FREE")
			for _, p := range st.GetPools() {
				t.row(p.GetName(), list(p.GetSubnets()), itoa(p.GetUsed()),
					count(free(p.GetCapacityV4(), p.GetCapacityV6(), p.GetUsed())))
			}
			return t.flush()
		},
	}
}
