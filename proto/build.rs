//! Compiles `proto/outbox/v1/outbox.proto` with protox (a protobuf compiler written in Rust), so
//! building needs no `protoc` on the machine. Also writes the encoded descriptor set that server
//! reflection serves.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["outbox/v1/outbox.proto"], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("outbox_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
