//! Compiles the protobuf API with protox, a pure-Rust compiler, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/picket.proto");
    let descriptors = protox::compile(["proto/picket.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
