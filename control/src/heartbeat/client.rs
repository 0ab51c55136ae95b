//! The broker's side of the heartbeat: keep one stream open to whoever is controller.
//!
//! The controller's address comes from a `watch` channel fed by the Lease watcher, because the
//! holder changes: on a change the client drops its stream and dials the new address at once. A
//! stream that breaks, fails to open, or stays silent for `silence_timeout` (the controller pings
//! every second) is re-dialled after a backoff that doubles from `min_backoff` up to
//! `max_backoff`, and resets once a controller has actually answered — so a dead address is not
//! hammered, and a recovered controller is reached again within `max_backoff`.

use std::time::Duration;

use kaas_proto::framed::Framed;
use kaas_proto::heartbeat::controller_message::Kind;
use kaas_proto::heartbeat::heartbeat_client::HeartbeatClient as GrpcClient;
use kaas_proto::heartbeat::{BrokerStatus, TopicPartition as PbTopicPartition};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use crate::balancer::{BrokerId, TopicPartition};

/// Timings of the broker's side.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// How often the status is sent (docs/DESIGN.md: 1 s). A change of status is sent at once as well.
    pub status_interval: Duration,
    /// First re-dial delay after a failure.
    pub min_backoff: Duration,
    /// Cap of the re-dial delay.
    pub max_backoff: Duration,
    /// Give up a TCP connect after this long.
    pub connect_timeout: Duration,
    /// Treat the stream as broken when nothing (not even a PING) arrived for this long.
    pub silence_timeout: Duration,
    /// Send the full list of served partitions with every status (otherwise only the count).
    pub send_partition_list: bool,
    /// Signs statuses and checks the controller's messages ([`super::auth`]). `None`: no
    /// signatures (tests of the stream alone).
    pub key: Option<super::auth::ClusterKey>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            status_interval: Duration::from_secs(1),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            silence_timeout: Duration::from_secs(5),
            send_partition_list: false,
            key: None,
        }
    }
}

/// What this broker reports about itself. The broker updates it through a `watch` channel; the
/// client sends the latest value every `status_interval` and immediately after each change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStatus {
    /// This broker's id.
    pub broker_id: BrokerId,
    /// Advertised Kafka host.
    pub host: String,
    /// Advertised Kafka port.
    pub port: u16,
    /// Rack (zone).
    pub rack: Option<String>,
    /// The broker's own liveness verdict.
    pub healthy: bool,
    /// Shutting down (SIGTERM received).
    pub draining: bool,
    /// Version of the last applied assignment.
    pub applied_assignment_version: u64,
    /// Controller epoch of the last applied assignment.
    pub applied_controller_epoch: u64,
    /// Partitions this broker leads and serves now.
    pub partitions: Vec<TopicPartition>,
}

impl LocalStatus {
    /// A healthy, not draining broker serving nothing yet.
    pub fn new(broker_id: BrokerId, host: impl Into<String>, port: u16) -> Self {
        Self {
            broker_id,
            host: host.into(),
            port,
            rack: None,
            healthy: true,
            draining: false,
            applied_assignment_version: 0,
            applied_controller_epoch: 0,
            partitions: Vec::new(),
        }
    }

    /// The wire message, stamped with `sequence`.
    pub fn to_proto(&self, sequence: u64, with_partitions: bool) -> BrokerStatus {
        BrokerStatus {
            broker_id: self.broker_id.0,
            advertised_host: self.host.clone(),
            advertised_port: u32::from(self.port),
            rack: self.rack.clone().unwrap_or_default(),
            healthy: self.healthy,
            draining: self.draining,
            applied_assignment_version: self.applied_assignment_version,
            applied_controller_epoch: self.applied_controller_epoch,
            partitions_served: u32::try_from(self.partitions.len()).unwrap_or(u32::MAX),
            partitions: if with_partitions {
                self.partitions
                    .iter()
                    .map(|tp| PbTopicPartition {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            sequence,
            // Stamped and signed by `ClusterKey::sign_status` when the stream is signed.
            ..Default::default()
        }
    }
}

/// What the client surfaces to the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerEvent {
    /// A stream to `addr` is open and the controller has answered.
    Connected {
        /// The controller's address.
        addr: String,
    },
    /// The stream to `addr` ended; the client will re-dial.
    Disconnected {
        /// The controller's address.
        addr: String,
        /// Why, for logs.
        reason: String,
    },
    /// The controller is alive, at `controller_epoch`.
    Ping {
        /// The controller's Lease epoch.
        controller_epoch: u64,
        /// When this PING acknowledges a status: the instant that status was *sent*. The
        /// broker's write fence runs from here (not from the PING's arrival), because the
        /// controller counts a broker's silence from the status's arrival, which is later.
        acked_sent_at: Option<tokio::time::Instant>,
    },
    /// The controller wrote a new `assignment.json`: re-read it now.
    AssignmentChanged {
        /// Version of the new file.
        assignment_version: u64,
        /// Epoch of the controller that wrote it.
        controller_epoch: u64,
    },
}

/// Re-dial delays: doubling from `min` to `max`. Pure, so its bounds are unit-tested.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `min`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The delay before the next attempt; doubles the one after, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to `min` (after a controller answered).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// `host:port` → `http://host:port`; an address with a scheme is used as is.
pub fn endpoint_uri(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// How many recent statuses' send instants are kept to date acknowledgements (an ack older
/// than that is ignored: it could only shorten the fence, never extend it wrongly).
const SENT_HISTORY: usize = 64;

/// The reconnecting heartbeat client.
pub struct HeartbeatClient;

/// How one stream ended.
enum SessionEnd {
    /// The controller's address changed: dial the new one without delay.
    ControllerChanged,
    /// Nobody is listening any more (status or controller source dropped, events receiver
    /// dropped): stop.
    Stop,
    /// The stream failed; `answered` says whether the controller had answered on it.
    Failed { reason: String, answered: bool },
}

impl HeartbeatClient {
    /// Starts the client on the current tokio runtime.
    ///
    /// `controller` holds the controller's heartbeat address (`host:port` or a URI), `None`
    /// while no holder is known. `status` is this broker's status. Events arrive on the returned
    /// receiver; they are dropped (with a log line) if it is full, since each is either repeated
    /// (PING) or backed by the 1 s file poll (ASSIGNMENT_CHANGED). The task ends when `controller`
    /// or `status` loses its sender or the event receiver is dropped; abort the handle to stop
    /// it sooner.
    pub fn spawn(
        config: ClientConfig,
        controller: watch::Receiver<Option<String>>,
        status: watch::Receiver<LocalStatus>,
    ) -> (JoinHandle<()>, mpsc::Receiver<ControllerEvent>) {
        let (events_tx, events_rx) = mpsc::channel(64);
        let handle = tokio::spawn(run(config, controller, status, events_tx));
        (handle, events_rx)
    }
}

/// Sends an event; false when the receiver is gone.
fn emit(events: &mpsc::Sender<ControllerEvent>, event: ControllerEvent) -> bool {
    match events.try_send(event) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(event)) => {
            tracing::warn!(
                ?event,
                "heartbeat event dropped: receiver is not keeping up"
            );
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

async fn run(
    config: ClientConfig,
    mut controller: watch::Receiver<Option<String>>,
    mut status: watch::Receiver<LocalStatus>,
    events: mpsc::Sender<ControllerEvent>,
) {
    let mut backoff = Backoff::new(config.min_backoff, config.max_backoff);
    let mut sequence = 0u64;
    loop {
        let addr = loop {
            if let Some(addr) = controller.borrow_and_update().clone() {
                break addr;
            }
            if controller.changed().await.is_err() {
                return;
            }
        };
        let end = session(
            &config,
            &addr,
            &mut controller,
            &mut status,
            &events,
            &mut sequence,
        )
        .await;
        match end {
            SessionEnd::Stop => return,
            SessionEnd::ControllerChanged => {
                backoff.reset();
                if !emit(
                    &events,
                    ControllerEvent::Disconnected {
                        addr,
                        reason: "controller changed".into(),
                    },
                ) {
                    return;
                }
            }
            SessionEnd::Failed { reason, answered } => {
                tracing::debug!(%addr, %reason, "heartbeat stream ended");
                if answered {
                    backoff.reset();
                }
                if !emit(&events, ControllerEvent::Disconnected { addr, reason }) {
                    return;
                }
                let delay = backoff.next_delay();
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    changed = controller.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

/// Whether the controller address moved away from `addr` (marking the change seen).
fn moved_away(controller: &mut watch::Receiver<Option<String>>, addr: &str) -> bool {
    controller.borrow_and_update().as_deref() != Some(addr)
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
async fn session(
    config: &ClientConfig,
    addr: &str,
    controller: &mut watch::Receiver<Option<String>>,
    status: &mut watch::Receiver<LocalStatus>,
    events: &mpsc::Sender<ControllerEvent>,
    sequence: &mut u64,
) -> SessionEnd {
    let failed = |reason: String| SessionEnd::Failed {
        reason,
        answered: false,
    };
    let endpoint = match Endpoint::from_shared(endpoint_uri(addr)) {
        Ok(e) => e
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true),
        Err(e) => return failed(format!("bad controller address {addr:?}: {e}")),
    };
    let (tx, rx) = mpsc::channel::<Framed<BrokerStatus>>(4);
    // Send instants of recent statuses, to date the controller's acknowledgements.
    let sent_at =
        std::sync::Mutex::new(std::collections::VecDeque::<(u64, tokio::time::Instant)>::new());
    let mut send_status = |status: &watch::Receiver<LocalStatus>| {
        *sequence += 1;
        {
            let mut sent = sent_at.lock().expect("sent-at lock");
            if sent.len() == SENT_HISTORY {
                sent.pop_front();
            }
            sent.push_back((*sequence, tokio::time::Instant::now()));
        }
        let message = status
            .borrow()
            .to_proto(*sequence, config.send_partition_list);
        let message = match &config.key {
            Some(key) => key.sign_status(message),
            None => Framed::new(message),
        };
        // A full buffer means the transport is backed up; the next tick sends a fresher status.
        !matches!(
            tx.try_send(message),
            Err(mpsc::error::TrySendError::Closed(_))
        )
    };
    status.borrow_and_update();
    send_status(status);

    let open = async {
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        GrpcClient::new(channel)
            .heartbeat(ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())
    };
    let response = tokio::select! {
        r = open => r,
        changed = controller.changed() => {
            if changed.is_err() {
                return SessionEnd::Stop;
            }
            if moved_away(controller, addr) {
                return SessionEnd::ControllerChanged;
            }
            // Same address re-announced: keep dialling on the next attempt.
            return failed("controller re-announced while dialling".into());
        }
        _ = tokio::time::sleep(config.connect_timeout + config.silence_timeout) => {
            Err("timed out opening the stream".into())
        }
    };
    let mut inbound = match response {
        Ok(r) => r.into_inner(),
        Err(e) => return failed(e),
    };

    let mut answered = false;
    let mut tick = tokio::time::interval(config.status_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; a status was just sent
    let silence = tokio::time::sleep(config.silence_timeout);
    tokio::pin!(silence);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if !send_status(status) {
                    return SessionEnd::Failed { reason: "request stream closed".into(), answered };
                }
            }
            changed = status.changed() => {
                if changed.is_err() {
                    return SessionEnd::Stop;
                }
                status.borrow_and_update();
                if !send_status(status) {
                    return SessionEnd::Failed { reason: "request stream closed".into(), answered };
                }
            }
            changed = controller.changed() => {
                if changed.is_err() {
                    return SessionEnd::Stop;
                }
                if moved_away(controller, addr) {
                    return SessionEnd::ControllerChanged;
                }
            }
            message = inbound.message() => {
                let message = match message {
                    Ok(Some(m)) => m,
                    Ok(None) => return SessionEnd::Failed { reason: "controller closed the stream".into(), answered },
                    Err(e) => return SessionEnd::Failed { reason: e.to_string(), answered },
                };
                if let Some(key) = &config.key {
                    let me = status.borrow().broker_id.0;
                    if let Err(e) = key.verify_message(&message, me) {
                        // Not from a controller of this cluster: it proves nothing, and above
                        // all its acknowledgements must not open the write fence.
                        super::auth::refused(&format!("ignoring a message on the heartbeat stream from {addr}: {e}"));
                        continue;
                    }
                }
                silence.as_mut().reset(tokio::time::Instant::now() + config.silence_timeout);
                if !answered {
                    answered = true;
                    if !emit(events, ControllerEvent::Connected { addr: addr.to_owned() }) {
                        return SessionEnd::Stop;
                    }
                }
                let event = match message.message.kind {
                    Some(Kind::Ping(p)) => ControllerEvent::Ping {
                        controller_epoch: p.controller_epoch,
                        acked_sent_at: (p.acked_sequence != 0)
                            .then(|| sent_at.lock().expect("sent-at lock").iter().find(|(s, _)| *s == p.acked_sequence).map(|(_, t)| *t))
                            .flatten(),
                    },
                    Some(Kind::AssignmentChanged(a)) => ControllerEvent::AssignmentChanged {
                        assignment_version: a.assignment_version,
                        controller_epoch: a.controller_epoch,
                    },
                    None => continue,
                };
                if !emit(events, event) {
                    return SessionEnd::Stop;
                }
            }
            _ = &mut silence => {
                return SessionEnd::Failed {
                    reason: format!("no message from the controller for {:?}", config.silence_timeout),
                    answered,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Backoff doubles from the floor, stays under the cap, and resets.
    #[test]
    fn backoff_is_bounded() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let got: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 700, 700]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    // Bare host:port gets a scheme; full URIs are kept.
    #[test]
    fn endpoint_uris() {
        assert_eq!(endpoint_uri("127.0.0.1:9094"), "http://127.0.0.1:9094");
        assert_eq!(endpoint_uri("https://c:1"), "https://c:1");
    }
}
