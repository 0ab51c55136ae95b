//! The Kafka wire protocol for kaas, with no IO in it.
//!
//! Owns: request/response framing ([`frame`]), the registry of API versions we serve
//! ([`versions`]), request decoding and response encoding ([`codec`]; versions newer than the
//! generated codec in [`beyond`]), and the bounds-checked
//! record-batch header peeks ([`batch`]) that let the broker store and serve record data as the
//! producer sent it, the check of a produced batch's records before it is stored ([`records`]),
//! and the allocator guard for the decoders' untrusted lengths ([`alloc`]).
//! Runs on any thread: shards call it on their own core; `kaas-bench`, fuzzers and tests call it
//! directly. Nothing here reads a socket or a file.

pub mod alloc;
pub mod batch;
pub mod beyond;
pub mod codec;
pub mod error;
pub mod fetch_frame;
pub mod frame;
pub mod records;
pub mod varint;
pub mod versions;

pub use error::WireError;
/// The generated message codecs. Re-exported so every crate uses the same version.
pub use kafka_protocol;
