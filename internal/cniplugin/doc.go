// Package cniplugin is the whole of skein's CNI plugin binaries (skein and
// skein-vm): read the runtime's request as the CNI library's skel would
// (dispatch.go), forward it in one timed gRPC call to one of skeind's
// services, print skeind's answer or a spec error carrying the
// configuration's cniVersion. It stays small and links nothing heavy (see
// internal/cniclient and the binaries' imports tests): the binaries are
// exec'd for every ADD and DEL.
package cniplugin
