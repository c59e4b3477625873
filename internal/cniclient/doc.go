// Package cniclient is the skein CNI binary's side of skeind's CNI gRPC
// service: one unary gRPC call over HTTP/2 cleartext on a UNIX socket.
//
// Why not grpc-go: the CNI binary is exec'd once per ADD/DEL, and importing
// grpc-go (with the protobuf registry it initialises) costs about 1.1 ms of
// start-up on the 2-core machines we measure on — a quarter of an ADD — and
// golang.org/x/net/http2's Transport another 0.4 ms through net/http. The
// gRPC wire protocol for one unary call on its own connection is small: a
// POST to /<service>/<method> with content-type application/grpc, the
// message in a 5-byte length-prefixed frame, grpc-status/grpc-message
// trailers. h2.go speaks that much HTTP/2 (header compression from
// x/net/http2/hpack), the messages are encoded by wire.go (no
// registry, no protobuf module). skeind serves the same service with grpc-go; the tests here
// run this client against that real server.
package cniclient
