// Package cni is skein's CNI layer, pure: network configuration parsing and
// validation, CNI_ARGS, results in every spec version, and spec errors. It
// opens no sockets and touches no kernel state; skeind calls it.
package cni
