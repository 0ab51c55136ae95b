//! What a broker logs about its heartbeat stream to the controller: the moment the stream is
//! lost (once, not once per re-dial), how long it was down when it is back, and once a stream
//! that has not opened for a whole write fence. The heartbeat client reports every ended
//! session, and while a dead controller's Lease runs out it re-dials every backoff step (5 to 7
//! failed dials per follower with 3 s Leases, each of which was a WARN saying "lost").

use std::time::Duration;

use tokio::time::Instant;

/// What to say about one heartbeat event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The stream opened; `down_for` when it had been lost before (None at the first open).
    Open { down_for: Option<Duration> },
    /// The stream that was open ended (WARN: writes stop being acknowledged at the fence).
    Lost,
    /// No stream has opened for longer than the write fence (WARN, once per outage).
    Unreachable { down_for: Duration },
    /// Another failed dial of an outage already reported (debug).
    Quiet,
}

/// The stream's state as far as the logs are concerned.
#[derive(Debug)]
pub struct StreamReport {
    fence: Duration,
    up: bool,
    /// When the current outage began (the broker's start, before the first open).
    down_since: Instant,
    /// Whether this outage was reported as a WARN.
    warned: bool,
}

impl StreamReport {
    /// A broker starting at `now`, whose writes are fenced `fence` after the last acknowledgement.
    pub fn new(now: Instant, fence: Duration) -> Self {
        Self {
            fence,
            up: false,
            down_since: now,
            warned: false,
        }
    }

    pub fn connected(&mut self, now: Instant) -> Report {
        let down_for = self.warned.then(|| now - self.down_since);
        self.up = true;
        self.warned = false;
        Report::Open { down_for }
    }

    pub fn disconnected(&mut self, now: Instant) -> Report {
        if self.up {
            self.up = false;
            self.down_since = now;
            self.warned = true;
            return Report::Lost;
        }
        let down_for = now - self.down_since;
        if !self.warned && down_for >= self.fence {
            self.warned = true;
            return Report::Unreachable { down_for };
        }
        Report::Quiet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FENCE: Duration = Duration::from_millis(2500);

    #[test]
    fn a_lost_stream_is_reported_once_however_often_the_client_re_dials() {
        let t0 = Instant::now();
        let mut r = StreamReport::new(t0, FENCE);
        assert_eq!(r.connected(t0), Report::Open { down_for: None });
        assert_eq!(r.disconnected(t0 + Duration::from_secs(1)), Report::Lost);
        for ms in [1100, 1300, 1700, 2500, 4100, 7300] {
            assert_eq!(
                r.disconnected(t0 + Duration::from_millis(ms)),
                Report::Quiet,
                "a re-dial {ms} ms in"
            );
        }
        assert_eq!(
            r.connected(t0 + Duration::from_secs(9)),
            Report::Open {
                down_for: Some(Duration::from_secs(8))
            }
        );
        // The next outage is reported again.
        assert_eq!(r.disconnected(t0 + Duration::from_secs(20)), Report::Lost);
    }

    #[test]
    fn a_controller_not_yet_listening_at_start_is_quiet_until_a_fence_has_passed() {
        let t0 = Instant::now();
        let mut r = StreamReport::new(t0, FENCE);
        assert_eq!(r.disconnected(t0 + Duration::from_millis(1)), Report::Quiet);
        assert_eq!(
            r.disconnected(t0 + Duration::from_millis(800)),
            Report::Quiet
        );
        assert_eq!(
            r.disconnected(t0 + Duration::from_millis(2600)),
            Report::Unreachable {
                down_for: Duration::from_millis(2600)
            }
        );
        assert_eq!(r.disconnected(t0 + Duration::from_secs(60)), Report::Quiet);
        assert_eq!(
            r.connected(t0 + Duration::from_secs(61)),
            Report::Open {
                down_for: Some(Duration::from_secs(61))
            }
        );
    }

    #[test]
    fn a_quick_first_open_is_a_plain_open() {
        let t0 = Instant::now();
        let mut r = StreamReport::new(t0, FENCE);
        assert_eq!(r.disconnected(t0 + Duration::from_millis(2)), Report::Quiet);
        assert_eq!(
            r.connected(t0 + Duration::from_millis(100)),
            Report::Open { down_for: None }
        );
    }
}
