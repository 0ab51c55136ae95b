//! The Kafka wire protocol for kaas, with no IO in it.
//!
//! Owns: request/response framing, the registry of API versions we serve, and the bounds-checked
//! record-batch header peeks that let the broker treat record data as opaque bytes. Runs on any
//! thread: shards call it on their own core, `kaas-bench`, fuzzers and tests call it directly.

/// The generated message codecs. Re-exported so every crate uses the same version.
pub use kafka_protocol;
