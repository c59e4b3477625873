// Package webhook is skein-controller's validating admission webhook for
// AddressPools and the certificate it serves with, which the controller
// makes and rotates itself (no cert-manager).
//
// The rules (validate.go) are pure functions of the old pool, the new pool
// and the other pools: subnets may only be appended, blockSizeBits never
// changes, no pool overlaps another, every subnet holds a block and the
// two subnets of a dual-stack entry are the same size so they pair up
// block for block. Block arithmetic is internal/ipam's Geometry, reached
// through AddressPool.Geometry (api/v1alpha1).
//
// The certificates (certs.go) live in one Secret that every replica
// shares; rotator.go keeps it current, patches its CA bundle into the
// ValidatingWebhookConfiguration and hands the served certificate to the
// TLS server, which picks up a rotated one on the next handshake. Add
// wires both into a controller-runtime manager.
package webhook
