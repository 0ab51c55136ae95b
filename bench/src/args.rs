//! Command-line options: one option set shared by the three modes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

/// The smallest message the bench sends: the first 8 bytes of every value carry the intended send
/// time, which the end-to-end mode reads back on the consumer side.
pub const MIN_MESSAGE_SIZE_BYTES: usize = 8;

#[derive(Parser, Debug)]
#[command(
    name = "kaas-bench",
    version,
    about = "Kafka-protocol load generator: produce, consume and end-to-end latency"
)]
pub struct Cli {
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Mode {
    /// Write messages as fast as allowed (or at --rate) and measure acknowledgement latency.
    Produce(Opts),
    /// Read the topic's stored messages, partition by partition, and measure throughput.
    Consume(Opts),
    /// Produce and consume together; latency is from the intended send time to receipt.
    E2e(Opts),
}

impl Mode {
    pub fn opts(&self) -> &Opts {
        match self {
            Mode::Produce(o) | Mode::Consume(o) | Mode::E2e(o) => o,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Mode::Produce(_) => "produce",
            Mode::Consume(_) => "consume",
            Mode::E2e(_) => "e2e",
        }
    }
}

/// Which acknowledgement the producer asks for.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Acks {
    /// `acks=0`: the broker sends no response, so no latency is measured.
    #[value(name = "0")]
    None,
    /// `acks=1`: the leader has appended the batch.
    #[value(name = "1")]
    Leader,
    /// `acks=all` (-1): every in-sync replica has it.
    #[value(name = "all", alias = "-1")]
    All,
}

impl Acks {
    pub fn wire_value(self) -> i16 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Acks::None => "0",
            Acks::Leader => "1",
            Acks::All => "all",
        }
    }
}

/// Record-batch compression codec (attribute bits 0-2 of a v2 batch).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Lz4,
}

impl Compression {
    pub fn attribute_bits(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Lz4 => 3,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Lz4 => "lz4",
        }
    }
}

/// Where the consume mode starts reading.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The log start offset: read everything stored.
    Earliest,
    /// The high watermark at start-up: read only what arrives during the run.
    Latest,
}

#[derive(Args, Debug, Clone, Serialize)]
#[command(args_override_self = true)]
pub struct Opts {
    /// Any broker of the cluster, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,

    /// Topic to use; created with CreateTopics when it does not exist.
    #[arg(long, default_value = "kaas-bench")]
    pub topic: String,

    /// Partition count used when the topic is created.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..=100_000))]
    pub partitions: i32,

    /// Replication factor used when the topic is created.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i16).range(1..=16))]
    pub replication_factor: i16,

    /// Topic config set at creation, KEY=VALUE (repeatable), e.g. flush.messages=1.
    #[arg(long = "topic-config", value_parser = parse_key_value)]
    pub topic_configs: Vec<(String, String)>,

    /// Size of each message value in bytes (suffixes k/KiB/m/MiB accepted).
    #[arg(long, default_value = "1024", value_parser = parse_message_size)]
    pub message_size: usize,

    /// Upper bound of one record batch in bytes before it is sent (Kafka's batch.size).
    #[arg(long, default_value = "16384", value_parser = parse_bytes)]
    pub batch_size: usize,

    /// How long a batch that is not full may wait for more messages (Kafka's linger.ms).
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,

    /// Acknowledgement asked of the broker: all, 1 or 0.
    #[arg(long, value_enum, default_value = "all")]
    pub acks: Acks,

    /// Record-batch compression.
    #[arg(long, value_enum, default_value = "none")]
    pub compression: Compression,

    /// Target rate in messages per second over all producers; 0 means as fast as possible.
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate)]
    pub rate: f64,

    /// Number of producer tasks, each with its own connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,

    /// Number of consumer tasks; partitions are dealt out among them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub consumers: u32,

    /// Time before measurement starts (default 2s for produce and e2e, 0s for consume).
    #[arg(long, value_parser = parse_duration)]
    #[serde(serialize_with = "ser_opt_duration")]
    pub warmup: Option<Duration>,

    /// Measured time after the warm-up. Consume stops earlier once it has read everything.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub duration: Duration,

    /// Give each message a key; keys are spread over partitions by Kafka's murmur2 partitioner.
    #[arg(long)]
    pub keyed: bool,

    /// Number of distinct keys used with --keyed.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_count: u64,

    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Requests a connection may have outstanding (Kafka's max.in.flight.requests.per.connection).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_in_flight: u32,

    /// Upper bound of one produce request in bytes (Kafka's max.request.size).
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    pub max_request_size: usize,

    /// Bytes a producer may hold unacknowledged before it stops generating (buffer.memory).
    #[arg(long, default_value = "32MiB", value_parser = parse_bytes)]
    pub buffer_memory: usize,

    /// Broker-side timeout of produce requests, and how long to wait for stragglers at the end.
    #[arg(long, default_value_t = 30_000)]
    pub request_timeout_ms: i32,

    /// Where consume starts (e2e always starts at the high watermark).
    #[arg(long, value_enum, default_value = "earliest")]
    pub from: StartFrom,

    /// Consume: stop after this many messages.
    #[arg(long)]
    pub messages: Option<u64>,

    /// Fetch: most bytes returned per partition (max.partition.fetch.bytes).
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    pub fetch_partition_max_bytes: usize,

    /// Fetch: most bytes returned per response (fetch.max.bytes).
    #[arg(long, default_value = "50MiB", value_parser = parse_bytes)]
    pub fetch_max_bytes: usize,

    /// Fetch: how long the broker may hold a fetch waiting for data (fetch.max.wait.ms).
    #[arg(long, default_value_t = 500)]
    pub fetch_max_wait_ms: i32,

    /// Tokio worker threads of the bench process.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,

    /// Client id sent in every request header.
    #[arg(long, default_value = "kaas-bench")]
    pub client_id: String,

    /// Do not print the per-second progress line.
    #[arg(long)]
    pub quiet: bool,
}

impl Opts {
    /// The warm-up actually used: explicit, or the mode's default.
    pub fn warmup_for(&self, mode_is_consume: bool) -> Duration {
        self.warmup.unwrap_or(if mode_is_consume {
            Duration::ZERO
        } else {
            Duration::from_secs(2)
        })
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn ser_opt_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `250us` or a bare number of seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 10s, 500ms, 2m"))?;
    let seconds = match unit.trim() {
        "" | "s" | "sec" | "secs" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("invalid duration unit {other:?} in {s:?}")),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses a byte count: `1024`, `16k`/`16KiB`/`16KB` (×1024), `1m`/`1MiB`/`1MB` (×1024²).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: usize = num
        .parse()
        .map_err(|_| format!("invalid byte count {s:?}: expected e.g. 1024, 16KiB, 1MiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        other => return Err(format!("invalid byte unit {other:?} in {s:?}")),
    };
    value
        .checked_mul(mult)
        .ok_or_else(|| format!("byte count {s:?} too large"))
}

fn parse_message_size(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    if n < MIN_MESSAGE_SIZE_BYTES {
        return Err(format!(
            "message size must be at least {MIN_MESSAGE_SIZE_BYTES} bytes (the value carries its send time)"
        ));
    }
    if n > 64 * 1024 * 1024 {
        return Err("message size above 64 MiB is not supported".into());
    }
    Ok(n)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate {s:?}"))?;
    if !r.is_finite() || r < 0.0 {
        return Err(format!("rate must be >= 0, got {s:?}"));
    }
    Ok(r)
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("empty key in {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kaas-bench").chain(args.iter().copied()))
    }

    /// The scripted form named in the issue parses into the expected options.
    #[test]
    fn parses_the_scripted_form() {
        let cli = parse(&[
            "produce",
            "--bootstrap",
            "127.0.0.1:19092",
            "--topic",
            "t1",
            "--partitions",
            "100",
            "--message-size",
            "1024",
            "--duration",
            "10s",
            "--acks",
            "all",
            "--json",
            "/tmp/out.json",
        ])
        .unwrap();
        let Mode::Produce(o) = &cli.mode else {
            panic!("wrong mode")
        };
        assert_eq!(o.bootstrap, "127.0.0.1:19092");
        assert_eq!(o.topic, "t1");
        assert_eq!(o.partitions, 100);
        assert_eq!(o.message_size, 1024);
        assert_eq!(o.duration, Duration::from_secs(10));
        assert_eq!(o.acks, Acks::All);
        assert_eq!(
            o.json.as_deref(),
            Some(std::path::Path::new("/tmp/out.json"))
        );
        assert_eq!(o.warmup_for(false), Duration::from_secs(2));
    }

    /// Every option named in the brief is accepted, in each mode.
    #[test]
    fn parses_every_option_in_every_mode() {
        for mode in ["produce", "consume", "e2e"] {
            let cli = parse(&[
                mode,
                "--bootstrap",
                "localhost:9092",
                "--topic",
                "x",
                "--partitions",
                "3",
                "--replication-factor",
                "1",
                "--message-size",
                "2KiB",
                "--batch-size",
                "64k",
                "--linger-ms",
                "7",
                "--acks",
                "1",
                "--compression",
                "lz4",
                "--rate",
                "5000",
                "--producers",
                "2",
                "--consumers",
                "3",
                "--warmup",
                "500ms",
                "--duration",
                "1m",
                "--keyed",
                "--topic-config",
                "flush.messages=1",
            ])
            .unwrap();
            assert_eq!(cli.mode.name(), mode);
            let o = cli.mode.opts();
            assert_eq!(o.message_size, 2048);
            assert_eq!(o.batch_size, 65536);
            assert_eq!(o.linger_ms, 7);
            assert_eq!(o.acks, Acks::Leader);
            assert_eq!(o.compression, Compression::Lz4);
            assert_eq!(o.rate, 5000.0);
            assert_eq!((o.producers, o.consumers), (2, 3));
            assert_eq!(o.warmup_for(true), Duration::from_millis(500));
            assert_eq!(o.duration, Duration::from_secs(60));
            assert!(o.keyed);
            assert_eq!(
                o.topic_configs,
                vec![("flush.messages".to_string(), "1".to_string())]
            );
        }
    }

    /// Defaults: acks=all, no compression, max rate, and the consume warm-up is zero.
    #[test]
    fn defaults_are_the_documented_ones() {
        let cli = parse(&["consume"]).unwrap();
        let o = cli.mode.opts();
        assert_eq!(o.acks, Acks::All);
        assert_eq!(o.compression, Compression::None);
        assert_eq!(o.rate, 0.0);
        assert_eq!(o.warmup_for(true), Duration::ZERO);
        assert_eq!(o.batch_size, 16384);
        assert_eq!(o.max_request_size, 1 << 20);
        assert_eq!(o.acks.wire_value(), -1);
        assert_eq!(Acks::None.wire_value(), 0);
    }

    /// A repeated option takes its last value, so scripts can append overrides to defaults.
    #[test]
    fn later_options_override_earlier_ones() {
        let cli = parse(&[
            "consume",
            "--warmup",
            "2s",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ])
        .unwrap();
        assert_eq!(cli.mode.opts().warmup_for(true), Duration::ZERO);
        assert_eq!(cli.mode.opts().duration, Duration::from_secs(1));
    }

    /// Bad values are refused with an error rather than silently clamped.
    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["produce", "--acks", "2"]).is_err());
        assert!(parse(&["produce", "--message-size", "4"]).is_err());
        assert!(parse(&["produce", "--rate", "-1"]).is_err());
        assert!(parse(&["produce", "--duration", "ten"]).is_err());
        assert!(parse(&["produce", "--partitions", "0"]).is_err());
        assert!(parse(&["produce", "--compression", "brotli"]).is_err());
        assert!(parse(&["produce", "--topic-config", "novalue"]).is_err());
        assert!(parse(&["bogus"]).is_err());
    }

    /// Duration and byte-count suffixes mean what they say.
    #[test]
    fn unit_suffixes() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("16KB").unwrap(), 16 << 10);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("1.5k").is_err());
    }
}
