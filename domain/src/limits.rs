//! Content limits: the largest values a notification's fields may hold. Both services enforce
//! them through the content types, and clients may rely on them. Each is generous for a
//! human-readable notification and small enough that a flood of maximal messages cannot exhaust
//! memory on a site node. The transport's own limit (the largest gRPC message) is in
//! `outbox_proto::limits`.

/// Longest list name, in characters. List names are short identifiers chosen by operators.
pub const MAX_LIST_NAME_CHARS: usize = 128;
/// Longest subject, in characters: plenty for a one-line summary. Central folds the Subject
/// header into short lines whatever its length, so the limit is about readability, not RFC 5322's
/// 998-octet line cap.
pub const MAX_SUBJECT_CHARS: usize = 500;
/// Largest body, in bytes (256 KiB): a long alarm report, never an attachment.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Largest `type_data` JSON text, in bytes.
pub const MAX_TYPE_DATA_BYTES: usize = 16 * 1024;
/// Longest site id, in characters.
pub const MAX_SITE_ID_CHARS: usize = 64;
/// Longest condition key, in characters: a dotted tag name such as `tank4.level.high`.
pub const MAX_CONDITION_KEY_CHARS: usize = 128;
/// Longest `source_instance_id` / `source_script`, in characters.
pub const MAX_SOURCE_FIELD_CHARS: usize = 256;
/// Furthest ahead of the site's enqueue time a notification may be scheduled
/// (`deliver_after`): 30 days. Long enough for a monthly reminder, short enough that a
/// scheduled row is never a forgotten resident of the queue (and that a wrong clock or unit,
/// seconds taken for milliseconds, is refused at `Send` rather than stored for years).
pub const MAX_DELIVER_AFTER: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
