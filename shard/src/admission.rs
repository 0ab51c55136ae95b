//! What the broker lets in: connections (`--max-connections`, `--max-connections-per-ip`),
//! memory for request bodies (`--queued-max-request-bytes`), and produced bytes while the data
//! volume has room (`--min-free-bytes`, see [`crate::disk`]), broker-wide.
//!
//! One [`Admission`] is shared by every shard (it is the only broker-wide state a connection
//! touches). Its counters are atomics; the per-address connection counts sit behind a mutex
//! that only `accept` and connection close take — a few hundred nanoseconds per connection,
//! never per request.
//!
//! # Request memory
//!
//! A request body's first [`FIRST_CHUNK_BYTES`] are read without touching the budget (most
//! requests are smaller than that: they never wait, and thousands of connections trickling
//! bytes hold a few megabytes between them). Only once those have arrived is the rest of the
//! body reserved, all at once: a reservation is never partial, so requests waiting for memory
//! hold none and cannot deadlock each other (partial reservations that grew as bytes arrived
//! did: eight 3 MiB requests stuck halfway through a 4 MiB budget). The buffer itself still
//! grows as bytes arrive, so resident memory follows what was received (a body already whole
//! in the connection's read buffer is allocated at its length at once). When the budget is
//! exhausted a connection stops reading its socket until other requests finish (TCP then pushes
//! back on the client) rather than allocating — Kafka's `queued.max.request.bytes`. A client
//! that reserves a large body and then stalls is closed by the progress timeout
//! (`--request-progress-timeout-ms`), which gives its reservation back. Reservations are
//! released when the last reference to the body drops, on whichever shard that happens.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How much of a body is read before its memory is reserved from the budget (see the module
/// docs); it is bounded per connection instead, by `--max-connections`.
pub const FIRST_CHUNK_BYTES: usize = 4 * 1024;

/// Limits, from the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of request bodies being received or served at once, broker-wide.
    pub request_bytes: usize,
    /// Open client connections, broker-wide; at the limit, new ones wait in the accept queue.
    pub connections: usize,
    /// Open client connections from one IP address; beyond it, new ones are closed at once.
    pub connections_per_ip: usize,
}

/// Broker-wide admission state (see the module docs).
#[derive(Debug)]
pub struct Admission {
    /// The limits the flags set; `connections` and `connections_per_ip` can be changed at run
    /// time (Kafka's dynamic `max.connections` and `max.connections.per.ip`), the atomics below.
    flags: Limits,
    connections: AtomicUsize,
    connections_per_ip: AtomicUsize,
    reserved: AtomicUsize,
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Connections closed at once because their address had `connections_per_ip` open.
    pub refused_per_ip: AtomicU64,
    /// Times the accept loop waited because `connections` were open.
    pub accept_paused: AtomicU64,
    /// Times a connection stopped reading because the request memory budget was exhausted.
    pub memory_waits: AtomicU64,
    /// Connections closed after `connections.max.idle.ms` without a request.
    pub closed_idle: AtomicU64,
    /// Connections closed because a request body stopped arriving
    /// (`--request-progress-timeout-ms`).
    pub closed_slow: AtomicU64,
    /// The data volume's free space and the produce floor.
    pub disk: Arc<crate::disk::DiskSpace>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `connections` are open: wait for one to close (the connection stays in the backlog).
    Full,
    /// This address has `connections_per_ip` open: close the new connection.
    PerIp,
}

impl Admission {
    pub fn new(limits: Limits, disk: Arc<crate::disk::DiskSpace>) -> Arc<Admission> {
        assert!(
            limits.request_bytes > 0 && limits.connections > 0 && limits.connections_per_ip > 0
        );
        Arc::new(Admission {
            flags: limits,
            connections: AtomicUsize::new(limits.connections),
            connections_per_ip: AtomicUsize::new(limits.connections_per_ip),
            reserved: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            refused_per_ip: AtomicU64::new(0),
            accept_paused: AtomicU64::new(0),
            memory_waits: AtomicU64::new(0),
            closed_idle: AtomicU64::new(0),
            closed_slow: AtomicU64::new(0),
            disk,
        })
    }

    /// The limits in force now.
    pub fn limits(&self) -> Limits {
        Limits {
            request_bytes: self.flags.request_bytes,
            connections: self.connections.load(Ordering::Acquire),
            connections_per_ip: self.connections_per_ip.load(Ordering::Acquire),
        }
    }

    /// Applies the dynamic `max.connections` / `max.connections.per.ip` (None: back to the
    /// flag). Connections already open stay open, as in Kafka; only new ones are held to it.
    pub fn set_connection_limits(&self, connections: Option<usize>, per_ip: Option<usize>) {
        let connections = connections.unwrap_or(self.flags.connections).max(1);
        let per_ip = per_ip.unwrap_or(self.flags.connections_per_ip).max(1);
        self.connections.store(connections, Ordering::Release);
        self.connections_per_ip.store(per_ip, Ordering::Release);
    }

    /// Whether another connection may be accepted now (broker-wide limit).
    pub fn has_room(&self) -> bool {
        self.open.load(Ordering::Acquire) < self.connections.load(Ordering::Acquire)
    }

    /// Admits a connection from `ip`; the permit gives the slot back when dropped.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnPermit, Refusal> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if self.open.load(Ordering::Acquire) >= self.connections.load(Ordering::Acquire) {
            return Err(Refusal::Full);
        }
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= self.connections_per_ip.load(Ordering::Acquire) {
            self.refused_per_ip.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::PerIp);
        }
        *n += 1;
        self.open.fetch_add(1, Ordering::AcqRel);
        Ok(ConnPermit {
            admission: Arc::clone(self),
            ip,
        })
    }

    /// Open connections, broker-wide.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Bytes of request memory reserved now.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Reserves `bytes` of request memory if the budget has room.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let mut current = self.reserved.load(Ordering::Acquire);
        loop {
            let next = current.checked_add(bytes)?;
            if next > self.flags.request_bytes {
                return None;
            }
            match self.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Reservation {
                        admission: Arc::clone(self),
                        bytes,
                    })
                }
                Err(actual) => current = actual,
            }
        }
    }
}

/// A connection slot; given back on drop.
#[derive(Debug)]
pub struct ConnPermit {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut per_ip = self
            .admission
            .per_ip
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
        self.admission.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Request memory; given back on drop, on any thread.
#[derive(Debug)]
pub struct Reservation {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let before = self
                .admission
                .reserved
                .fetch_sub(self.bytes, Ordering::AcqRel);
            debug_assert!(before >= self.bytes, "released more than was reserved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn no_floor() -> Arc<crate::disk::DiskSpace> {
        crate::disk::DiskSpace::new(&std::env::temp_dir(), Some(0)).unwrap()
    }

    fn limits() -> Limits {
        Limits {
            request_bytes: 1000,
            connections: 3,
            connections_per_ip: 2,
        }
    }

    /// The memory budget bounds requests in flight, and a dropped reservation returns its bytes.
    #[test]
    fn the_budget_is_never_exceeded_and_comes_back() {
        let a = Admission::new(limits(), no_floor());
        let r1 = a.try_reserve(600).unwrap();
        assert!(a.try_reserve(500).is_none());
        let r2 = a.try_reserve(400).unwrap();
        assert_eq!(a.reserved(), 1000);
        drop(r1);
        let r3 = a.try_reserve(100).unwrap();
        assert_eq!((a.reserved(), r2.bytes() + r3.bytes()), (500, 500));
        drop((r2, r3));
        assert_eq!(a.reserved(), 0);
    }

    /// One client address cannot take every slot; the total cap holds across addresses.
    #[test]
    fn connections_per_ip_and_in_all() {
        let a = Admission::new(limits(), no_floor());
        let ip1: IpAddr = "127.0.0.1".parse().unwrap();
        let ip2: IpAddr = "127.0.0.2".parse().unwrap();
        let c1 = a.admit(ip1).unwrap();
        let _c2 = a.admit(ip1).unwrap();
        assert_eq!(a.admit(ip1).unwrap_err(), Refusal::PerIp);
        let _c3 = a.admit(ip2).unwrap();
        assert!(!a.has_room());
        assert_eq!(a.admit(ip2).unwrap_err(), Refusal::Full);
        drop(c1);
        assert!(a.has_room());
        let _c4 = a.admit(ip1).unwrap();
        assert_eq!(a.open(), 3);
    }

    proptest! {
        // Whatever interleaving of reservations and releases: the budget is never exceeded,
        // and everything reserved comes back.
        #[test]
        fn reservations_never_exceed_the_budget(ops in proptest::collection::vec((0usize..600, any::<bool>()), 1..200)) {
            let a = Admission::new(limits(), no_floor());
            let mut held = Vec::new();
            for (bytes, release) in ops {
                if release && !held.is_empty() {
                    held.swap_remove(bytes % held.len());
                } else if let Some(r) = a.try_reserve(bytes) {
                    held.push(r);
                }
                prop_assert!(a.reserved() <= 1000);
                prop_assert_eq!(a.reserved(), held.iter().map(Reservation::bytes).sum::<usize>());
            }
            drop(held);
            prop_assert_eq!(a.reserved(), 0);
        }
    }
}
