//! The `outbox.v1` contract shared by the site-forwarder, central-outbox and their clients:
//! generated protobuf types and tonic stubs, the descriptor set for server reflection, the
//! transport limit, the conversions between wire messages and the validated content types, and
//! the one-line text of a transport error ([`error_chain`]).
//! (The TLS files both services load live in the `tls-files` crate.)
//!
//! The content rules themselves are not here: they live in the `outbox-domain` crate, which has
//! no transport, and `submission` is the one place a `NotificationSubmit` becomes those types
//! (and back).

mod error_chain;
pub mod limits;
pub mod submission;
pub mod time;

pub use error_chain::error_chain;

/// Generated messages and services of package `outbox.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("outbox.v1");
}

/// Encoded `FileDescriptorSet` of the contract, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/outbox_descriptor.bin"));

/// Server reflection (for `grpcurl list` and friends) that advertises exactly `services`, plus
/// the health and reflection services. Both servers register the whole contract's descriptors,
/// so without the explicit list central would advertise the site's `SiteNotify` and vice versa.
pub fn reflection(services: &[&str]) -> tonic_reflection::server::Builder<'static> {
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    services
        .iter()
        .copied()
        .chain([
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ])
        .fold(builder, |builder, name| builder.with_service_name(name))
}
