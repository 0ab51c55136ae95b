//! Time base and rate control.
//!
//! Every timestamp the bench compares is nanoseconds since one process-wide `Instant`, so a
//! producer task's intended send time and a consumer task's receipt time share a clock.
//!
//! A fixed-rate run must not hide broker stalls (coordinated omission): when the producer falls
//! behind, the messages it owes keep the send times they were *meant* to have, and latency is
//! measured from those. [`Pacer`] therefore hands out the k-th intended time as
//! `start + k / rate`, independent of when it is asked.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// The bench's clock origin; fixed on first use.
pub fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`].
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// The `Instant` of a bench-clock reading, for timers.
pub fn instant_of(ns: u64) -> Instant {
    epoch() + Duration::from_nanos(ns)
}

/// Hands out intended send times for one producer at a fixed rate.
#[derive(Debug, Clone)]
pub struct Pacer {
    start_ns: u64,
    /// Nanoseconds between two messages; `None` means no pacing (maximum rate).
    interval_ns: Option<f64>,
    next_index: u64,
}

impl Pacer {
    /// A pacer for `rate_per_s` messages per second starting at `start_ns`; a rate of 0 means
    /// unpaced, where every message is due at once and its intended time is the time it is made.
    pub fn new(rate_per_s: f64, start_ns: u64) -> Self {
        let interval_ns = (rate_per_s > 0.0).then(|| 1e9 / rate_per_s);
        Pacer {
            start_ns,
            interval_ns,
            next_index: 0,
        }
    }

    /// One of `count` producers sharing a total rate: each gets `rate / count` and they are
    /// offset by a fraction of the total interval so their sends interleave evenly.
    pub fn for_producer(total_rate_per_s: f64, start_ns: u64, index: u32, count: u32) -> Self {
        if total_rate_per_s <= 0.0 {
            return Pacer::new(0.0, start_ns);
        }
        let offset_ns = (index as f64 * 1e9 / total_rate_per_s) as u64;
        Pacer::new(total_rate_per_s / count as f64, start_ns + offset_ns)
    }

    pub fn is_paced(&self) -> bool {
        self.interval_ns.is_some()
    }

    /// Intended send time of message `k` (counting from 0).
    pub fn intended_ns(&self, k: u64) -> u64 {
        match self.interval_ns {
            Some(iv) => self.start_ns + (k as f64 * iv).round() as u64,
            None => self.start_ns,
        }
    }

    /// When the next message is due; `None` when unpaced.
    pub fn next_due_ns(&self) -> Option<u64> {
        self.interval_ns.map(|_| self.intended_ns(self.next_index))
    }

    /// Takes the next message if it is due at `now_ns` and returns its intended send time.
    /// Unpaced, every call succeeds and the intended time is `now_ns` itself.
    pub fn take_due(&mut self, now_ns: u64) -> Option<u64> {
        match self.interval_ns {
            None => {
                self.next_index += 1;
                Some(now_ns)
            }
            Some(_) => {
                let t = self.intended_ns(self.next_index);
                if t <= now_ns {
                    self.next_index += 1;
                    Some(t)
                } else {
                    None
                }
            }
        }
    }

    /// Messages handed out so far.
    pub fn taken(&self) -> u64 {
        self.next_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At 1000 msg/s the k-th message is due at start + k ms, and nothing is due early.
    #[test]
    fn intended_times_are_start_plus_k_over_rate() {
        let mut p = Pacer::new(1000.0, 5_000_000);
        assert_eq!(p.next_due_ns(), Some(5_000_000));
        assert_eq!(p.take_due(4_999_999), None);
        assert_eq!(p.take_due(5_000_000), Some(5_000_000));
        assert_eq!(p.next_due_ns(), Some(6_000_000));
        assert_eq!(p.take_due(5_999_999), None);
        assert_eq!(p.intended_ns(1000), 5_000_000 + 1_000_000_000);
    }

    /// A producer that stalls still owes the missed messages, each with its original intended
    /// time: this is what makes fixed-rate latency free of coordinated omission.
    #[test]
    fn a_stall_keeps_the_intended_times() {
        let mut p = Pacer::new(100.0, 0); // one message every 10 ms
        assert_eq!(p.take_due(0), Some(0));
        // Stalled for 55 ms: messages 1..=5 are due, at 10, 20, 30, 40, 50 ms.
        let now = 55_000_000;
        let mut got = Vec::new();
        while let Some(t) = p.take_due(now) {
            got.push(t);
        }
        assert_eq!(
            got,
            vec![10_000_000, 20_000_000, 30_000_000, 40_000_000, 50_000_000]
        );
        assert_eq!(p.taken(), 6);
        assert_eq!(p.next_due_ns(), Some(60_000_000));
    }

    /// Fractional intervals do not drift: after a million messages at 3 msg/s the schedule is
    /// still within a nanosecond of k/3 s.
    #[test]
    fn no_drift_with_fractional_interval() {
        let p = Pacer::new(3.0, 0);
        let k = 1_000_000u64;
        let exact = k as f64 * 1e9 / 3.0;
        assert!((p.intended_ns(k) as f64 - exact).abs() <= 1.0);
    }

    /// Unpaced (rate 0): always due, intended time is now.
    #[test]
    fn unpaced_is_always_due() {
        let mut p = Pacer::new(0.0, 0);
        assert!(!p.is_paced());
        assert_eq!(p.next_due_ns(), None);
        assert_eq!(p.take_due(42), Some(42));
        assert_eq!(p.take_due(43), Some(43));
        assert_eq!(p.taken(), 2);
    }

    /// Four producers sharing 4000 msg/s each run at 1000 msg/s and interleave 250 µs apart, so
    /// together they produce one message every 250 µs.
    #[test]
    fn producers_share_and_interleave_the_rate() {
        let mut all: Vec<u64> = (0..4)
            .flat_map(|i| {
                let p = Pacer::for_producer(4000.0, 0, i, 4);
                (0..10).map(move |k| p.intended_ns(k)).collect::<Vec<_>>()
            })
            .collect();
        all.sort_unstable();
        for (k, t) in all.iter().enumerate() {
            assert_eq!(*t, k as u64 * 250_000, "message {k}");
        }
    }
}
