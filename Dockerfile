# One image with both binaries: the daemon (virtual-node-eci) and the local ECI (mock-eci).
#   docker build -t virtual-node-eci:latest .
# Build stage: the workspace in release mode (no protoc needed: protox compiles the contract).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The daemon without the embedded mock (the `embedded-mock` feature), mock-eci on its own.
RUN cargo build --release --locked -p virtual-node-eci --no-default-features \
 && cargo build --release --locked -p mock-eci \
 && cp target/release/virtual-node-eci target/release/mock-eci /usr/local/bin/

# Runtime: glibc and CA certificates only, no shell, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/virtual-node-eci /usr/local/bin/mock-eci /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/virtual-node-eci"]
