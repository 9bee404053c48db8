//! Wire limits: the largest values the contract accepts. Both services enforce them, and clients
//! may rely on them. Each is generous for a human-readable notification and small enough that a
//! flood of maximal messages cannot exhaust memory on a site node.

/// Longest list name, in characters. List names are short identifiers chosen by operators.
pub const MAX_LIST_NAME_CHARS: usize = 128;
/// Longest subject, in characters. RFC 5322 caps a header line at 998 octets; 500 characters of
/// UTF-8 stay under that after encoding in the common case and is plenty for a one-line summary.
pub const MAX_SUBJECT_CHARS: usize = 500;
/// Largest body, in bytes (256 KiB): a long alarm report, never an attachment.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Largest `type_data` JSON text, in bytes.
pub const MAX_TYPE_DATA_BYTES: usize = 16 * 1024;
/// Longest site id, in characters.
pub const MAX_SITE_ID_CHARS: usize = 64;
/// Longest `source_instance_id` / `source_script`, in characters.
pub const MAX_SOURCE_FIELD_CHARS: usize = 256;
/// Largest encoded gRPC message either server decodes (1 MiB). A maximal notification is about
/// 280 KiB, so anything larger is malformed and is refused by tonic before it is buffered.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 1024 * 1024;
