//! `kaas-bench`: a Kafka produce/consume load generator that speaks the wire protocol itself.
//!
//! Owns: a small pipelined async Kafka client (framing, correlation ids, version negotiation)
//! built on the codecs `kaas-wire` re-exports, a record-batch builder and header walker, paced
//! producers, partition-by-partition fetch consumers, and the latency/throughput reporting. It
//! works against any Kafka-compatible broker, so kaas and Apache Kafka are measured by the same
//! client. Runs on a tokio multi-thread runtime in its own process; nothing here is used by the
//! broker.
//!
//! Reading order: `args` (what can be asked), `run` (how a mode is orchestrated), `produce` and
//! `consume` (the two task kinds), `client` and `cluster` (the protocol), `records` (batch bytes),
//! `pacer` and `stats` (timing and reporting).

pub mod args;
pub mod client;
pub mod cluster;
pub mod consume;
pub mod pacer;
pub mod produce;
pub mod records;
pub mod run;
pub mod stats;
