package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/api/rpc"
)

func (a *app) poolCmd() *cobra.Command {
	cmd := groupCmd("pool", "Manage address pools", "pools")
	cmd.AddCommand(a.poolCreateCmd(), a.poolListCmd(), a.poolShowCmd(), a.poolDeleteCmd())
	return cmd
}

func (a *app) poolCreateCmd() *cobra.Command {
	var p rpc.Pool
	cmd := &cobra.Command{
		Use:   "create NAME --subnet CIDR [--subnet CIDR...]",
		Short: "Create an address pool",
		Long: "Create an address pool from one or more IPv4 and/or IPv6 subnets.\n" +
			"skeind validates the pool and answers with it as stored.",
		Example: "  skeinctl pool create default --subnet 10.88.0.0/16 --subnet fd88::/48 \\\n" +
			"      --reserve 10.88.0.1 --reserve 10.88.255.0/24 --reserve 10.88.1.10-10.88.1.20",
		Args: oneArg("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.useKube() {
				return a.kubeWriteRefused("pool create")
			}
			if len(p.Subnets) == 0 {
				return usagef("pool create: at least one --subnet is required")
			}
			p.Name = args[0]
			var created *rpc.Pool
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				var err error
				created, err = c.CreatePool(ctx, &p)
				return err
			})
			if err != nil {
				return err
			}
			return a.printPool(created)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&p.Subnets, "subnet", nil, "subnet `CIDR` to allocate from (repeatable, IPv4 and/or IPv6)")
	f.Uint32Var(&p.BlockSizeBits, "block-size-bits", 0, "blocks of 2^`N` addresses per node (0: skeind's default, 5)")
	f.StringSliceVar(&p.Reserved, "reserve", nil, "never hand out `ADDR|CIDR|FIRST-LAST` (repeatable)")
	return cmd
}

func (a *app) poolListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List address pools",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pools []*rpc.Pool
			var err error
			if a.useKube() {
				err = a.withKube(cmd.Context(), func(ctx context.Context, c client.Reader) error {
					pools, err = kubePools(ctx, c)
					return err
				})
			} else {
				err = a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
					l, err := c.ListPools(ctx, &rpc.Empty{})
					pools = l.GetPools()
					return err
				})
			}
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSONList(a.stdout, pools)
			}
			return writePoolTable(a.stdout, pools)
		},
	}
}

func (a *app) poolShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show one address pool",
		Args:  oneArg("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p *rpc.Pool
			var err error
			if a.useKube() {
				err = a.withKube(cmd.Context(), func(ctx context.Context, c client.Reader) error {
					p, err = kubePool(ctx, c, args[0])
					return err
				})
			} else {
				err = a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
					p, err = c.GetPool(ctx, &rpc.PoolRef{Name: args[0]})
					return err
				})
			}
			if err != nil {
				return err
			}
			return a.printPool(p)
		},
	}
}

func (a *app) poolDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "delete NAME",
		Aliases: []string{"rm"},
		Short:   "Delete an address pool that nothing uses",
		Args:    oneArg("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.useKube() {
				return a.kubeWriteRefused("pool delete")
			}
			ref := &rpc.PoolRef{Name: args[0]}
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				_, err := c.DeletePool(ctx, ref)
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSON(a.stdout, ref)
			}
			_, err = fmt.Fprintf(a.stdout, "pool %q deleted\n", ref.Name)
			return err
		},
	}
}

// printPool writes one pool in the chosen output format.
func (a *app) printPool(p *rpc.Pool) error {
	if a.output == "json" {
		return writeJSON(a.stdout, p)
	}
	d := newDetails(a.stdout)
	d.field("Name", p.GetName())
	d.field("Subnets", list(p.GetSubnets()))
	d.field("Block bits", itoa(p.GetBlockSizeBits()))
	d.field("Reserved", list(p.GetReserved()))
	d.field("Blocks", itoa(p.GetBlocks()))
	d.field("Used", itoa(p.GetUsed()))
	d.field("Capacity", capacity(p.GetCapacityV4(), p.GetCapacityV6()))
	return d.flush()
}

func writePoolTable(w io.Writer, pools []*rpc.Pool) error {
	t := newTable(w, "NAME", "SUBNETS", "BLOCK-BITS", "BLOCKS", "USED", "CAPACITY")
	for _, p := range pools {
		t.row(p.GetName(), list(p.GetSubnets()), itoa(p.GetBlockSizeBits()),
			itoa(p.GetBlocks()), itoa(p.GetUsed()), capacity(p.GetCapacityV4(), p.GetCapacityV6()))
	}
	return t.flush()
}
