# syntax=docker/dockerfile:1
# tailnet-agent image: built with `cargo xtask images` (context: the repository root).
# Stage 1 compiles a static musl binary with --locked and the workspace release profile
# (full LTO, codegen-units=1, stripped); stage 2 is distroless/static: no shell, no libc,
# no package manager, running as the non-root user 65532.
ARG RUST_IMAGE=docker.io/library/rust:1.95-alpine
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${RUST_IMAGE} AS build
# ring's C/assembly parts need a C compiler and the musl headers.
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p tailnet-agent --bin tailnet-agent \
 && install -D -m 0755 target/release/tailnet-agent /out/tailnet-agent

FROM ${BASE_IMAGE}
COPY --from=build /out/tailnet-agent /usr/local/bin/tailnet-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tailnet-agent"]
