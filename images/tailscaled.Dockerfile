# syntax=docker/dockerfile:1
# tailnet-tailscaled image (the agent pods' tailscaled) for users with a container daemon:
# `cargo xtask images --dockerfile` (context: the repository root). CI and releases build the
# same image without a daemon (`cargo xtask images`: reproducible, by digest, from the binary
# `deps/build.sh tailscale-minimal` puts in the deps cache); both lay out the same file system
# with images/rootfs.sh (xtask's test dockerfile_layout_matches_the_daemonless_image compares
# them).
#
# Stage 1 runs the same `deps/build.sh tailscale-minimal` as CI: tailscale.com at
# TAILSCALE_VERSION of deps/versions.env, through our wrapper module deps/go/tailscale (go.sum
# checked), from the Go module proxy, with only the features an agent pod uses (its ts_omit_*
# build tags), CGO_ENABLED=0 and -trimpath. Stage 2 is FROM scratch, as the other images:
# /etc/passwd and /etc/group, the build stage's CA bundle, /home/nonroot, /tmp and
# /usr/local/bin/tailscaled. Non-root user 65532 (the agent pods set their own user anyway).
#
# The build stage is pinned by tag only: this repository's CI has no access to Docker Hub to
# resolve its digest. Pin it when you build, e.g.
#   --build-arg GO_IMAGE=docker.io/library/golang:1.26-alpine@sha256:<digest of `crane digest`>
ARG GO_IMAGE=docker.io/library/golang:1.26-alpine

FROM ${GO_IMAGE} AS build
RUN apk add --no-cache bash ca-certificates
WORKDIR /src
COPY deps/ deps/
COPY images/ images/
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    TNO_DEPS_DIR=/deps bash deps/build.sh tailscale-minimal \
 && mkdir -p /out && cp /deps/tailscale-minimal-*/bin/tailscaled /out/tailscaled \
 && sh images/rootfs.sh /out/tailscaled /etc/ssl/certs/ca-certificates.crt /rootfs

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/usr/local/bin/tailscaled"]
