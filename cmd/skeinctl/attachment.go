package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/skeinnet/skein/api/rpc"
)

func (a *app) attachmentCmd() *cobra.Command {
	cmd := groupCmd("attachment", "Inspect container attachments", "attachments", "att")
	cmd.AddCommand(a.attachmentListCmd(), a.attachmentShowCmd())
	return cmd
}

func (a *app) attachmentListCmd() *cobra.Command {
	var filter rpc.AttachmentFilter
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List container attachments",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var atts []*rpc.Attachment
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				var err error
				atts, err = listAttachments(ctx, c, &filter)
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSONList(a.stdout, atts)
			}
			now := a.now()
			t := newTable(a.stdout, "NETWORK", "CONTAINER", "IFNAME", "POOL", "ADDRESSES", "HOST-LINK", "OWNER", "AGE")
			for _, at := range atts {
				t.row(at.GetNetwork(), shortID(at.GetContainerId()), at.GetIfname(), at.GetPool(),
					list(at.GetAddresses()), at.GetHostLink(), at.GetOwner(), age(at.GetCreated(), now))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&filter.Network, "network", "", "only attachments to network `N`")
	f.StringVar(&filter.Pool, "pool", "", "only attachments with addresses from pool `P`")
	f.StringVar(&filter.ContainerId, "container", "", "only attachments of container `ID` (full ID)")
	return cmd
}

func (a *app) attachmentShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show CONTAINER_ID",
		Short: "Show every attachment of one container",
		Long: "Show every attachment of one container. CONTAINER_ID may be a unique\n" +
			"prefix of the ID, such as the 12 characters that tables show.",
		Args: oneArg("CONTAINER_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var atts []*rpc.Attachment
			err := a.withAdmin(cmd.Context(), func(ctx context.Context, c rpc.AdminClient) error {
				var err error
				atts, err = containerAttachments(ctx, c, args[0])
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSONList(a.stdout, atts)
			}
			now := a.now()
			for i, at := range atts {
				if i > 0 {
					fmt.Fprintln(a.stdout)
				}
				d := newDetails(a.stdout)
				d.field("Container", at.GetContainerId())
				d.field("Network", at.GetNetwork())
				d.field("Interface", at.GetIfname())
				d.field("MAC", at.GetContainerMac())
				d.field("Netns", at.GetNetns())
				d.field("Pool", at.GetPool())
				d.field("Addresses", list(at.GetAddresses()))
				d.field("Host link", at.GetHostLink())
				d.field("Owner", at.GetOwner())
				created := at.GetCreated()
				if created != "" {
					created += " (" + age(created, now) + " ago)"
				}
				d.field("Created", created)
				if err := d.flush(); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func listAttachments(ctx context.Context, c rpc.AdminClient, f *rpc.AttachmentFilter) ([]*rpc.Attachment, error) {
	l, err := c.ListAttachments(ctx, f)
	return l.GetAttachments(), err
}

// containerAttachments returns the attachments of the container whose ID is
// id or, failing an exact match, starts with id. skeind filters by full ID
// only, so a prefix is resolved here against the full list; a prefix shared
// by two containers is an error rather than a guess.
func containerAttachments(ctx context.Context, c rpc.AdminClient, id string) ([]*rpc.Attachment, error) {
	atts, err := listAttachments(ctx, c, &rpc.AttachmentFilter{ContainerId: id})
	if err != nil || len(atts) > 0 {
		return atts, err
	}
	all, err := listAttachments(ctx, c, &rpc.AttachmentFilter{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, at := range all {
		if strings.HasPrefix(at.GetContainerId(), id) {
			atts = append(atts, at)
			if !slices.Contains(ids, at.GetContainerId()) {
				ids = append(ids, at.GetContainerId())
			}
		}
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("no attachments for container %q", id)
	case len(ids) > 1:
		return nil, fmt.Errorf("container ID prefix %q is ambiguous: it matches %s", id, strings.Join(ids, ", "))
	}
	return atts, nil
}
