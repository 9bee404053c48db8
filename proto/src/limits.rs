//! Transport limits: what the gRPC servers and clients accept on the wire, whatever the message.
//! The limits of each content field (subject, body, list name...) are content rules and live in
//! `outbox_domain::limits`.

/// Largest encoded gRPC message either server decodes (4 MiB, gRPC's usual default). A maximal
/// valid notification is about 280 KiB; the transport limit sits well above it so that a request
/// that is merely too big (a log pasted into `body`) is decoded and refused by the content rules,
/// with INVALID_ARGUMENT naming the field and its limit, rather than by the transport. Only larger
/// messages are refused by tonic, from the length prefix and before they are buffered, with
/// OUT_OF_RANGE "decoded message length too large ... the limit is: 4194304 bytes".
pub const MAX_GRPC_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
