package main

import (
	"context"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/api/rpc"
)

func (a *app) blockCmd() *cobra.Command {
	cmd := groupCmd("block", "Inspect the address blocks handed to nodes", "blocks")
	cmd.AddCommand(a.blockListCmd())
	return cmd
}

func (a *app) blockListCmd() *cobra.Command {
	var filter rpc.BlockFilter
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List address blocks",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var blocks []*rpc.Block
			var err error
			if a.useKube() {
				err = a.withKube(cmd.Context(), func(ctx context.Context, c client.Reader) error {
					blocks, err = kubeBlocks(ctx, c, filter.Pool)
					return err
				})
			} else {
				err = a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
					l, err := c.ListBlocks(ctx, &filter)
					blocks = l.GetBlocks()
					return err
				})
			}
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSONList(a.stdout, blocks)
			}
			t := newTable(a.stdout, "POOL", "INDEX", "NODE", "IPV4", "IPV6", "USED", "SIZE")
			for _, b := range blocks {
				t.row(b.GetPool(), itoa(b.GetIndex()), b.GetNode(), b.GetIpv4(), b.GetIpv6(),
					itoa(b.GetUsed()), itoa(b.GetSize()))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&filter.Pool, "pool", "", "only blocks of pool `NAME`")
	return cmd
}
