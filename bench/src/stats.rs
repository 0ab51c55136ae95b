//! Measurement: per-task statistics merged at the end, live counters for the progress line, and
//! the final table and JSON.
//!
//! Each producer or consumer task owns a [`SideStats`] (no sharing on the hot path) and hands it
//! back when it finishes; the run merges them. The only shared state is [`LiveCounters`], a few
//! relaxed atomics read once a second by the progress printer.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::pacer;

/// Bytes in the "MB" of MB/s: Kafka's perf tools divide by 1024², and so do we.
pub const MB_BYTES: f64 = 1024.0 * 1024.0;

/// The measured interval on the bench clock: after the warm-up, for the configured duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Window {
    pub fn contains(&self, t_ns: u64) -> bool {
        t_ns >= self.start_ns && t_ns < self.end_ns
    }

    pub fn seconds(&self) -> f64 {
        (self.end_ns - self.start_ns) as f64 / 1e9
    }
}

/// Latency histogram in microseconds (3 significant digits, grows as needed).
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            hist: Histogram::new(3).expect("3 significant digits is a valid histogram"),
        }
    }
}

impl LatencyHistogram {
    /// Records one latency given in nanoseconds.
    pub fn record_ns(&mut self, latency_ns: u64) {
        let us = latency_ns / 1000;
        // `record` grows the histogram; `saturating_record` alone would clamp at its first size.
        if self.hist.record(us).is_err() {
            self.hist.saturating_record(us);
        }
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.hist
            .add(&other.hist)
            .expect("auto-resizing histograms always merge");
    }

    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Percentiles in milliseconds; `None` when nothing was recorded.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.hist.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(LatencySummary {
            count: self.hist.len(),
            p50_ms: ms(self.hist.value_at_quantile(0.50)),
            p99_ms: ms(self.hist.value_at_quantile(0.99)),
            p999_ms: ms(self.hist.value_at_quantile(0.999)),
            max_ms: ms(self.hist.max()),
            mean_ms: self.hist.mean() / 1000.0,
        })
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// What one producer or consumer task measured.
#[derive(Debug, Clone, Default)]
pub struct SideStats {
    /// Messages acknowledged (produce) or received (consume) inside the window.
    pub window_messages: u64,
    /// Their bytes: message payload for produce, record-batch bytes for consume.
    pub window_bytes: u64,
    /// Everything acknowledged or received, warm-up and drain included.
    pub total_messages: u64,
    pub total_bytes: u64,
    /// Messages whose intended send time fell in the window but that were never acknowledged.
    pub unacknowledged: u64,
    /// Latency of the messages whose intended send time fell in the window.
    pub latency: LatencyHistogram,
    /// Failed messages by Kafka error code (-1 stands for a connection failure).
    pub errors: BTreeMap<i16, u64>,
}

impl SideStats {
    pub fn merge(&mut self, other: &SideStats) {
        self.window_messages += other.window_messages;
        self.window_bytes += other.window_bytes;
        self.total_messages += other.total_messages;
        self.total_bytes += other.total_bytes;
        self.unacknowledged += other.unacknowledged;
        self.latency.merge(&other.latency);
        for (code, n) in &other.errors {
            *self.errors.entry(*code).or_default() += n;
        }
    }

    pub fn add_errors(&mut self, code: i16, messages: u64) {
        *self.errors.entry(code).or_default() += messages;
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The report of this side over `seconds` of measurement.
    pub fn report(&self, seconds: f64) -> SideReport {
        let seconds = seconds.max(1e-9);
        SideReport {
            messages: self.window_messages,
            bytes: self.window_bytes,
            seconds,
            msg_per_s: self.window_messages as f64 / seconds,
            mb_per_s: self.window_bytes as f64 / MB_BYTES / seconds,
            total_messages: self.total_messages,
            total_bytes: self.total_bytes,
            unacknowledged: self.unacknowledged,
            latency_ms: self.latency.summary(),
            errors: self
                .errors
                .iter()
                .map(|(code, n)| (error_name(*code), *n))
                .collect(),
            expected_messages: None,
            caught_up: None,
        }
    }
}

/// A readable name for a Kafka error code in reports.
pub fn error_name(code: i16) -> String {
    let name = match code {
        -1 => "CONNECTION",
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        35 => "UNSUPPORTED_VERSION",
        76 => "UNSUPPORTED_COMPRESSION_TYPE",
        87 => "INVALID_RECORD",
        _ => "",
    };
    if name.is_empty() {
        format!("error_{code}")
    } else {
        format!("{name}({code})")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SideReport {
    /// Messages in the measurement window.
    pub messages: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub msg_per_s: f64,
    /// MiB per second, as Kafka's perf tools count it.
    pub mb_per_s: f64,
    pub total_messages: u64,
    pub total_bytes: u64,
    pub unacknowledged: u64,
    pub latency_ms: Option<LatencySummary>,
    pub errors: BTreeMap<String, u64>,
    /// Consume: messages between the start offsets and the end offsets it aimed for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_messages: Option<u64>,
    /// Consume: whether every partition reached its end offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caught_up: Option<bool>,
}

/// Counters the progress line reads; tasks add to them as they go.
#[derive(Debug, Default)]
pub struct LiveCounters {
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub latency_sum_us: AtomicU64,
    pub latency_count: AtomicU64,
}

impl LiveCounters {
    pub fn add(&self, messages: u64, bytes: u64) {
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn add_latency(&self, sum_us: u64, count: u64) {
        self.latency_sum_us.fetch_add(sum_us, Ordering::Relaxed);
        self.latency_count.fetch_add(count, Ordering::Relaxed);
    }

    pub fn add_errors(&self, n: u64) {
        self.errors.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> [u64; 5] {
        [
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.latency_sum_us.load(Ordering::Relaxed),
            self.latency_count.load(Ordering::Relaxed),
        ]
    }
}

/// Prints one progress line per second to stderr until `stop` is set.
pub async fn progress_loop(
    sides: Vec<(&'static str, Arc<LiveCounters>)>,
    window: Window,
    stop: Arc<AtomicBool>,
) {
    let mut last: Vec<[u64; 5]> = sides.iter().map(|(_, c)| c.snapshot()).collect();
    let mut last_ns = pacer::now_ns();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let now = pacer::now_ns();
        let dt = (now - last_ns) as f64 / 1e9;
        let mut line = format!(
            "[{:6.1}s]",
            now.saturating_sub(window.start_ns) as f64 / 1e9
        );
        for (i, (name, c)) in sides.iter().enumerate() {
            let cur = c.snapshot();
            let d: Vec<u64> = cur.iter().zip(&last[i]).map(|(a, b)| a - b).collect();
            let lat = if d[4] > 0 {
                format!("{:8.3} ms avg", d[3] as f64 / d[4] as f64 / 1000.0)
            } else {
                "           -   ".to_string()
            };
            line.push_str(&format!(
                " {name} {:>10.0} msg/s {:>8.2} MB/s {lat}",
                d[0] as f64 / dt,
                d[1] as f64 / MB_BYTES / dt,
            ));
            if d[2] > 0 {
                line.push_str(&format!(" {} errors", d[2]));
            }
            last[i] = cur;
        }
        if now < window.start_ns {
            line.push_str("  (warm-up)");
        } else if now >= window.end_ns {
            line.push_str("  (draining)");
        }
        last_ns = now;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// The whole run's result, as written to `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub mode: &'static str,
    pub options: crate::args::Opts,
    /// Partitions the topic actually has (it may have existed with another count).
    pub topic_partitions: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// API versions used, by request name.
    pub api_versions: BTreeMap<String, i16>,
    pub produce: Option<SideReport>,
    pub consume: Option<SideReport>,
    pub notes: Vec<String>,
}

impl Report {
    /// The human table printed on stdout.
    pub fn table(&self) -> String {
        let o = &self.options;
        let rate = if o.rate > 0.0 {
            format!("{} msg/s", o.rate)
        } else {
            "max".into()
        };
        let mut s = format!(
            "kaas-bench {} -> {}  topic={} partitions={} message={} B batch={} B linger={} ms \
             acks={} compression={} rate={} producers={} consumers={}\n",
            self.mode,
            o.bootstrap,
            o.topic,
            self.topic_partitions,
            o.message_size,
            o.batch_size,
            o.linger_ms,
            o.acks.label(),
            o.compression.label(),
            rate,
            o.producers,
            o.consumers,
        );
        s.push_str(&format!(
            "window {:.2} s after {:.2} s warm-up\n\n",
            self.duration_s, self.warmup_s
        ));
        s.push_str(&format!(
            "{:<13} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
            "", "messages", "msg/s", "MB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors"
        ));
        let mut row = |label: &str, r: &SideReport| {
            let lat = |f: fn(&LatencySummary) -> f64| {
                r.latency_ms
                    .as_ref()
                    .map(|l| format!("{:.3}", f(l)))
                    .unwrap_or_else(|| "-".into())
            };
            s.push_str(&format!(
                "{:<13} {:>11} {:>11.1} {:>9.2} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
                label,
                r.messages,
                r.msg_per_s,
                r.mb_per_s,
                lat(|l| l.p50_ms),
                lat(|l| l.p99_ms),
                lat(|l| l.p999_ms),
                lat(|l| l.max_ms),
                r.errors.values().sum::<u64>(),
            ));
        };
        if let Some(p) = &self.produce {
            row("produce", p);
        }
        if let Some(c) = &self.consume {
            row(
                if self.mode == "e2e" {
                    "consume (e2e)"
                } else {
                    "consume"
                },
                c,
            );
        }
        for side in [&self.produce, &self.consume].into_iter().flatten() {
            for (name, n) in &side.errors {
                s.push_str(&format!("  error {name}: {n} messages\n"));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Merging the histograms of several producer tasks gives the same percentiles as recording
    /// every sample in one histogram.
    #[test]
    fn merged_histograms_match_a_single_one() {
        let mut single = LatencyHistogram::default();
        let mut parts = vec![LatencyHistogram::default(); 4];
        // Task i sees latencies shifted by i ms, so the merged tail comes from one task only.
        for i in 0..4u64 {
            for v in 1..=10_000u64 {
                let ns = v * 1_000 + i * 1_000_000;
                single.record_ns(ns);
                parts[i as usize].record_ns(ns);
            }
        }
        let mut merged = LatencyHistogram::default();
        for p in &parts {
            merged.merge(p);
        }
        assert_eq!(merged.len(), 40_000);
        assert_eq!(merged.summary(), single.summary());
        let s = merged.summary().unwrap();
        // The max comes from task 3: 10 ms + 3 ms.
        assert!((s.max_ms - 13.0).abs() < 0.02, "{s:?}");
        // Median of the union lies between the tasks' medians (5..8 ms).
        assert!(s.p50_ms > 5.0 && s.p50_ms < 8.5, "{s:?}");
    }

    /// Merging per-task stats adds counts and errors and keeps the latency tail.
    #[test]
    fn side_stats_merge_adds_everything() {
        let mut a = SideStats {
            window_messages: 10,
            window_bytes: 1000,
            total_messages: 12,
            total_bytes: 1200,
            ..Default::default()
        };
        a.latency.record_ns(1_000_000);
        a.add_errors(6, 3);
        let mut b = SideStats {
            window_messages: 5,
            window_bytes: 500,
            total_messages: 5,
            total_bytes: 500,
            unacknowledged: 2,
            ..Default::default()
        };
        b.latency.record_ns(50_000_000);
        b.add_errors(6, 1);
        b.add_errors(7, 2);
        a.merge(&b);
        assert_eq!((a.window_messages, a.window_bytes), (15, 1500));
        assert_eq!((a.total_messages, a.unacknowledged), (17, 2));
        assert_eq!(a.errors.get(&6), Some(&4));
        assert_eq!(a.error_count(), 6);
        let r = a.report(2.0);
        assert_eq!(r.msg_per_s, 7.5);
        let lat = r.latency_ms.unwrap();
        assert_eq!(lat.count, 2);
        assert!((lat.max_ms - 50.0).abs() < 0.1);
        assert_eq!(r.errors.get("NOT_LEADER_OR_FOLLOWER(6)"), Some(&4));
    }

    /// The window is half-open: start counts, end does not.
    #[test]
    fn window_bounds() {
        let w = Window {
            start_ns: 10,
            end_ns: 20,
        };
        assert!(!w.contains(9));
        assert!(w.contains(10));
        assert!(w.contains(19));
        assert!(!w.contains(20));
    }
}
