// Package store owns skein's durable state: pools, the blocks carved from
// them and which node owns each, and attachments (one interface of one
// container on one network, with the addresses it holds).
//
// The kernel is the truth for what is plumbed; the store keeps what the
// kernel cannot. An attachment is written before its addresses are plumbed,
// so a crash of skeind at any point never lets an address be handed out
// twice: on restart the allocator is rebuilt from the attachments here.
//
// Implementations: Bolt (embedded, one host) and, in internal/kubestore,
// the Kubernetes store: pools and blocks in the API server, attachments in
// a Bolt file opened with AttachmentsOnly. skeind puts either under a
// Tiered store, which keeps the attachments no reboot can outlive (the
// CNI front door's) in an unsynced second file: durable against a crash of
// skeind, not of the machine, after which there is nothing for them to
// describe (docs/architecture.md, "What is durable against what").
package store
