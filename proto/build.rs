//! Compiles `proto/eci/v20180808/eci.proto` with protox (pure Rust, no `protoc` binary).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/eci/v20180808/eci.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Plain-data messages: serde lets mock-eci persist them and tests dump them as JSON.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .message_attribute(".", "#[serde(default)]")
        .compile_fds(descriptors)?;
    Ok(())
}
