//! The consumer-group coordinator's decisions: group membership as state machines and the
//! server-side assignors, with no IO, no clock and no randomness of their own.
//!
//! Owns: the classic protocol ([`classic`]: JoinGroup / SyncGroup / Heartbeat / LeaveGroup),
//! the KIP-848 protocol ([`consumer`]: ConsumerGroupHeartbeat, reconciliation revoke before
//! assign, the target assignment), the assignors that compute a KIP-848 target ([`assignor`]:
//! `uniform`, `range`, `rack-aware`), which of the two protocols a group speaks and the
//! OffsetCommit / OffsetFetch checks on its members ([`GroupKind`]), online migration between
//! the two with classic members in a KIP-848 group (`consumer::classic_members`), the embedded
//! `consumer` protocol those members speak ([`consumer_protocol`]), the coordinator's settings
//! ([`config`]) and its errors ([`error`]).
//!
//! Runs on the shard that owns the group: `kaas_shard::groups::GroupManager`, one per shard
//! (glommio, `Rc`/`RefCell`), calls it from that shard's thread; the group's durable offsets
//! and the request handlers stay in `kaas-shard`. Nothing here has a thread, a runtime or a lock.
//!
//! Pure, so every rule is tested without sockets, sleeps or seeds:
//! - time comes in: every call takes `now: Instant`, and timeouts fire when the caller's timer
//!   calls `tick(now)`;
//! - new member ids come in: a member joining without an id gets one drawn by the caller's
//!   generator (`uuid` is built without its `v4` feature, so the crate cannot draw one);
//! - topics come in through the [`consumer::Topics`] trait, which the shard implements for its
//!   catalog snapshot. A trait rather than moving the catalog's `TopicTable` into `kaas-model`:
//!   that type carries serde, topic configs and data-directory paths this crate has no use for,
//!   while the trait is two methods, lets the shard hand its snapshot `Arc` over uncopied, and
//!   keeps "the table changed" a pointer comparison;
//! - assignors run through a function the caller passes in (the shard catches their panics);
//! - nothing logs: `tick` returns the members it removed, and the caller logs them;
//! - waiting is a `futures-channel` oneshot: a JoinGroup or SyncGroup that must wait for the
//!   rest of the group gets a receiver, answered by a later call.

pub mod assignor;
pub mod classic;
pub mod config;
pub mod consumer;
pub mod consumer_protocol;
pub mod error;
mod kind;

pub use config::GroupConfig;
pub use error::GroupError;
pub use kind::{Committer, GroupKind};
