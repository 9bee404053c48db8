//! Delivery adapters: one per channel type. An adapter turns a claimed notification and its
//! resolved list into one delivery attempt and reports `Delivered` or a classified
//! [`DeliveryError`]; it never touches the store (the dispatcher records outcomes).

pub mod email;

pub use email::EmailAdapter;
