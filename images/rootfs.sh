#!/bin/sh
# Lays out the file system of a tailnet-operator image under DEST, as images/*.Dockerfile
# copy it into `FROM scratch`. `cargo xtask images` builds the same layout without a daemon
# (xtask's test `dockerfile_layout_matches_the_daemonless_image` runs this script and
# compares paths, modes and owners).
#   images/rootfs.sh BINARY CA_BUNDLE DEST
set -eu
here=$(dirname "$0")
bin=$1 ca=$2 dest=$3
name=$(basename "$bin")
mkdir -p "$dest/etc/ssl/certs" "$dest/home/nonroot" "$dest/tmp" "$dest/usr/local/bin"
install -m 0644 "$here/rootfs/etc/passwd" "$dest/etc/passwd"
install -m 0644 "$here/rootfs/etc/group" "$dest/etc/group"
install -m 0644 "$ca" "$dest/etc/ssl/certs/ca-certificates.crt"
chmod 0700 "$dest/home/nonroot"
chown 65532:65532 "$dest/home/nonroot"
chmod 1777 "$dest/tmp"
install -m 0755 "$bin" "$dest/usr/local/bin/$name"
