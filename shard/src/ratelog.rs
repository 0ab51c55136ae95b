//! Warnings that a client can trigger at will (a refused connection, a malformed frame) are
//! logged at most once per [`INTERVAL`] per cause on each shard thread, with the number
//! suppressed since the last line: a flood of hostile requests must not become a flood of log.
//! The events themselves are still counted in `/metrics`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Shortest time between two lines of one cause on one thread.
pub const INTERVAL: Duration = Duration::from_secs(10);

thread_local! {
    static LAST: RefCell<HashMap<&'static str, (Instant, u64)>> = RefCell::new(HashMap::new());
}

/// Calls `log(suppressed)` unless a line for `cause` was logged on this thread within
/// [`INTERVAL`]; `suppressed` is how many were skipped since that line.
pub fn limited(cause: &'static str, log: impl FnOnce(u64)) {
    let now = Instant::now();
    let emit = LAST.with(|last| {
        let mut last = last.borrow_mut();
        match last.get_mut(cause) {
            Some((at, skipped)) if now.duration_since(*at) < INTERVAL => {
                *skipped += 1;
                None
            }
            Some(entry) => {
                let skipped = entry.1;
                *entry = (now, 0);
                Some(skipped)
            }
            None => {
                last.insert(cause, (now, 0));
                Some(0)
            }
        }
    });
    if let Some(suppressed) = emit {
        log(suppressed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cause that repeats a million times logs once per interval, with how many were skipped.
    #[test]
    fn one_line_per_interval_with_the_count_skipped() {
        let mut lines = Vec::new();
        for _ in 0..1000 {
            limited("test-cause", |n| lines.push(n));
        }
        assert_eq!(lines, vec![0]);
        LAST.with(|l| l.borrow_mut().get_mut("test-cause").unwrap().0 -= INTERVAL);
        limited("test-cause", |n| lines.push(n));
        assert_eq!(lines, vec![0, 999]);
    }
}
