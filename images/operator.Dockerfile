# syntax=docker/dockerfile:1
# tailnet-operator image for users with a container daemon: `cargo xtask images --dockerfile`
# (context: the repository root). CI and releases build the same image without a daemon
# (`cargo xtask images`: reproducible, by digest); both lay out the same file system with
# images/rootfs.sh (xtask's test dockerfile_layout_matches_the_daemonless_image compares them).
#
# Stage 1 compiles a static musl binary with --locked and the workspace release profile
# (full LTO, codegen-units=1, stripped). Stage 2 is FROM scratch: no base image, no shell, no
# libc, no package manager; /etc/passwd and /etc/group (root, nonroot 65532), the build
# stage's CA bundle, /home/nonroot, /tmp and the binary. Non-root user 65532.
#
# The build stage is pinned by tag only: this repository's CI has no access to Docker Hub to
# resolve its digest. Pin it when you build, e.g.
#   --build-arg RUST_IMAGE=docker.io/library/rust:1.95-alpine@sha256:<digest of `crane digest`>
ARG RUST_IMAGE=docker.io/library/rust:1.95-alpine

FROM ${RUST_IMAGE} AS build
# ring's C/assembly parts need a C compiler and the musl headers.
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p tailnet-operator --bin tailnet-operator \
 && sh images/rootfs.sh target/release/tailnet-operator /etc/ssl/certs/ca-certificates.crt /rootfs

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/usr/local/bin/tailnet-operator"]
