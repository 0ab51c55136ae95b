//! Generates the heartbeat message types and the tonic client/server from `heartbeat.proto`.
//!
//! The schema is parsed by `protox` (pure Rust) into a `FileDescriptorSet` and handed to
//! `tonic-prost-build`, so no `protoc` binary is looked for on the build machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=heartbeat.proto");
    let fds = protox::compile(["heartbeat.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
