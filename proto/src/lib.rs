//! Inter-broker gRPC schemas for kaas cluster mode, generated at build time from the `.proto`
//! files in this crate (see `build.rs`: parsed by the pure-Rust `protox`, so no system `protoc`).
//!
//! [`heartbeat`] is the broker ⇄ controller stream of `heartbeat.proto`; the logic around it
//! (registry, alive set, reconnecting client) lives in `kaas-control`'s `heartbeat` module.

/// `kaas.heartbeat.v1`: `BrokerStatus` up, `ControllerMessage` (PING / ASSIGNMENT_CHANGED) down.
#[allow(clippy::all, missing_docs)]
pub mod heartbeat {
    tonic::include_proto!("kaas.heartbeat.v1");
    include!(concat!(env!("OUT_DIR"), "/kaas.heartbeat.v1.Heartbeat.rs"));
}

pub mod framed;
