// Package image owns the images of Kurma-style pod network plugins: it
// parses their references, fetches them, and keeps one unpacked root
// filesystem per image digest under a cache directory.
//
// # References
//
// A pod network names its image in the config field `image` (`aci` is an
// alias kept from Kurma's document; the config parser maps it here), with an
// optional `digest: sha256:…` field:
//
//   - file:///path — an OCI image layout directory, or an archive: a
//     `docker save` tar, a tar of an OCI layout, or an ACI (appc) tar; plain
//     or gzip/bzip2-compressed. The format is detected from the content.
//   - http://… and https://… — any of the archive formats above. The digest
//     field is required and the download is verified against it before
//     anything is unpacked.
//   - docker://[host[:port]/]repo[:tag|@sha256:…] — any OCI registry, through
//     go-containerregistry. The reference must be pinned (by @sha256:… or the
//     digest field) unless AllowTags is set. Plain http is used only for
//     loopback registries (127.0.0.0/8, ::1, localhost) unless Insecure is
//     set. Kurma's `docker:///user/repo` (empty host) means Docker Hub.
//
// The digest that names an image is, for an archive (file or http), the
// sha256 of the archive's bytes; for an OCI layout directory or a registry,
// the digest of the manifest (or index) the reference resolves to.
//
// # The cache
//
// Each image is unpacked once into <dir>/sha256-<hex>/rootfs, with a
// meta.json beside it. Unpacking happens in a temporary directory in the
// same parent, is flushed to disk (syncfs) and renamed into place, so a
// crash never leaves a half image under its final name; leftovers are
// removed when the cache is opened. Concurrent requests for one digest
// share one fetch.
//
// Entries are written through os.Root and checked first:
//   - names with a ".." component or an absolute name are refused;
//   - an entry whose parent directory is a symlink (or a file) is refused,
//     so nothing is ever written through a link;
//   - a relative symlink may climb with leading ".." only as far as its own
//     depth; an absolute symlink target is rewritten to the equivalent
//     relative one (it meant the image root), so no link in the cache
//     leads outside it, whoever follows it;
//   - hard links must name an existing regular file inside the image (a
//     hard link to a symlink would move it to a depth where its ".."
//     could climb out);
//   - device nodes and FIFOs are refused; setuid, setgid bits are dropped;
//     ownership is not kept (everything belongs to the daemon's user);
//   - whiteouts (.wh.NAME, .wh..wh..opq) of OCI layers are applied,
//     layer by layer, and may not name "." or "..";
//   - total entry bytes (every entry's: whiteouts and an ACI's entries
//     outside rootfs/ too), entry count and path depth are capped
//     (Options);
//   - every read is bounded before it happens: an archive's bytes and its
//     decompressed stream, the layers' decompressed streams, and each
//     manifest, index and config (read whole by go-containerregistry) by
//     MaxManifest, checked against its descriptor and, where it is a
//     file, its real size; a cancelled context stops an unpack within an
//     entry.
//
// A refused image leaves nothing: its temporary directory is removed.
//
// # The plugin contract checked on unpack
//
// The image must hold executable regular files /opt/network/add and
// /opt/network/del. Its config's Entrypoint+Cmd (ACI: app.exec) is reported
// as the main exec, the process Kurma kept running for the network's
// lifetime; it may be empty.
//
// # Keeping images
//
// Acquire hands out an Image and a release function; Prune removes the
// unpacked digests that are neither held in this process nor in the set the
// caller passes (the digests its attachment records name), so it works the
// same after a restart.
package image
