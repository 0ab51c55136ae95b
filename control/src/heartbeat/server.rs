//! The controller's side of the heartbeat: a tonic service over the [`BrokerRegistry`].
//!
//! Each broker stream gets a task that records incoming statuses and sends the controller's
//! pushes. Pushes use `try_send` into a small per-stream buffer: a broker that stops reading must
//! not stall the controller, and losing a PING or an ASSIGNMENT_CHANGED is harmless — the broker
//! also polls `assignment.json` every second, and a stream that stays silent is re-dialled.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaas_proto::framed::Framed;
use kaas_proto::heartbeat::controller_message::Kind;
use kaas_proto::heartbeat::heartbeat_server::{Heartbeat, HeartbeatServer as GrpcServer};
use kaas_proto::heartbeat::{AssignmentChanged, BrokerStatus, ControllerMessage, Ping};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::{AckFloor, BrokerRegistry};
use crate::assignment::BrokerEntry;
use crate::balancer::{AliveBrokers, BrokerId};
use crate::lease::Leadership;

/// Timings of the controller's side.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How often each stream gets a PING, and how often the alive set is re-evaluated so that
    /// silent brokers age out (docs/DESIGN.md: 1 s).
    pub ping_interval: Duration,
    /// How long after its last status a broker stays in the alive set. Statuses come every
    /// second, so the default of 5 s tolerates a few lost ones and a quick re-dial.
    pub alive_timeout: Duration,
    /// The controller itself (id, rack), always in the alive set.
    pub pinned: Option<(BrokerId, Option<String>)>,
    /// The controller's own Lease view. When set, a status is acknowledged (a PING carrying
    /// its sequence) only while [`Leadership::leads_now`] holds: an acknowledgement extends the
    /// broker's write fence, so a deposed controller must never send one. `None` acknowledges
    /// every status (tests of the stream alone).
    pub leadership: Option<watch::Receiver<Leadership>>,
    /// Checks statuses and signs what is sent ([`super::auth`]). `None`: no signatures (tests
    /// of the stream alone).
    pub key: Option<super::auth::ClusterKey>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(1),
            alive_timeout: Duration::from_secs(5),
            pinned: None,
            leadership: None,
            key: None,
        }
    }
}

struct Shared {
    config: ServerConfig,
    registry: Mutex<BrokerRegistry>,
    alive: watch::Sender<AliveBrokers>,
    controller_epoch: AtomicU64,
    /// The latest `(assignment_version, controller_epoch)` announced; every stream pushes it
    /// when it changes, and a newly connected stream gets it at once.
    announced: watch::Sender<Option<(u64, u64)>>,
    next_stream: AtomicU64,
    /// Which statuses may be acknowledged (see [`AckFloor`]).
    ack_floor: Mutex<AckFloor>,
    /// Set when [`HeartbeatServer::serve`]'s shutdown fires: every stream task ends, so the
    /// graceful shutdown (which waits for open streams) completes and brokers re-dial at once.
    closing: watch::Sender<bool>,
}

impl Shared {
    /// Re-evaluates the alive set and notifies watchers only if it changed.
    fn refresh(&self, now: Instant) {
        let alive = self
            .registry
            .lock()
            .expect("registry lock")
            .alive(now, self.config.alive_timeout);
        crate::set_if_changed(&self.alive, alive);
    }

    /// Records a status; returns the acknowledgement to send, if the status was recorded and
    /// we may acknowledge (see [`ServerConfig::leadership`]).
    fn record(&self, stream: u64, status: BrokerStatus) -> Option<ControllerMessage> {
        let now = Instant::now();
        let sequence = status.sequence;
        let floor_ok = self.ack_floor.lock().expect("ack floor lock").allows(
            BrokerId(status.broker_id),
            (
                status.applied_controller_epoch,
                status.applied_assignment_version,
            ),
        );
        let recorded = self
            .registry
            .lock()
            .expect("registry lock")
            .record(stream, status, now);
        if !recorded {
            return None;
        }
        self.refresh(now);
        let may_ack = floor_ok
            && self
                .config
                .leadership
                .as_ref()
                .is_none_or(|l| l.borrow().leads_now());
        may_ack.then(|| self.ping(sequence))
    }

    fn ping(&self, acked_sequence: u64) -> ControllerMessage {
        ControllerMessage {
            kind: Some(Kind::Ping(Ping {
                controller_epoch: self.controller_epoch.load(Ordering::Acquire),
                acked_sequence,
            })),
            ..Default::default()
        }
    }
}

/// The controller's heartbeat endpoint. Cheap to clone; all clones share one registry.
#[derive(Clone)]
pub struct HeartbeatServer {
    shared: Arc<Shared>,
}

impl HeartbeatServer {
    /// A server for a controller holding the Lease at `controller_epoch`.
    pub fn new(config: ServerConfig, controller_epoch: u64) -> Self {
        let initial =
            BrokerRegistry::new(config.pinned.clone()).alive(Instant::now(), config.alive_timeout);
        // Tests of the stream alone (no Lease view) acknowledge every status.
        let config_acks_all = config.leadership.is_none();
        Self {
            shared: Arc::new(Shared {
                registry: Mutex::new(BrokerRegistry::new(config.pinned.clone())),
                config,
                alive: watch::channel(initial).0,
                controller_epoch: AtomicU64::new(controller_epoch),
                announced: watch::channel(None).0,
                next_stream: AtomicU64::new(1),
                ack_floor: Mutex::new(if config_acks_all {
                    AckFloor::default()
                } else {
                    AckFloor::for_epoch(controller_epoch)
                }),
                closing: watch::channel(false).0,
            }),
        }
    }

    /// The alive set, updated when a status changes it and when a broker ages out.
    pub fn alive(&self) -> watch::Receiver<AliveBrokers> {
        self.shared.alive.subscribe()
    }

    /// Re-evaluates the alive set now (the serve loop does this every `ping_interval`).
    pub fn refresh(&self) {
        self.shared.refresh(Instant::now());
    }

    /// A copy of the registry, e.g. to build the `brokers` rows of the next assignment.
    pub fn registry(&self) -> BrokerRegistry {
        self.shared.registry.lock().expect("registry lock").clone()
    }

    /// The `brokers` rows for the next `assignment.json` (see [`BrokerRegistry::broker_rows`]).
    pub fn broker_rows(&self, previous: &[BrokerEntry]) -> Vec<BrokerEntry> {
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .broker_rows(previous, Instant::now(), self.shared.config.alive_timeout)
    }

    /// No broker is acknowledged again until it reports having applied `key` (at least): the
    /// file a new term starts from (see [`AckFloor::raise_all`]).
    pub fn require_applied_by_all(&self, key: (u64, u64)) {
        self.shared
            .ack_floor
            .lock()
            .expect("ack floor lock")
            .raise_all(key);
    }

    /// `broker` lost a partition in the file `key` (about to be written): its statuses are not
    /// acknowledged again until it reports having applied that file (see [`AckFloor`]).
    pub fn require_applied(&self, broker: BrokerId, key: (u64, u64)) {
        self.shared
            .ack_floor
            .lock()
            .expect("ack floor lock")
            .raise(broker, key);
    }

    /// Sets the epoch carried by PING and ASSIGNMENT_CHANGED (after a Lease renewal reports a
    /// new one; normally it never changes while this server runs).
    pub fn set_controller_epoch(&self, epoch: u64) {
        self.shared.controller_epoch.store(epoch, Ordering::Release);
    }

    /// Pushes ASSIGNMENT_CHANGED to every connected broker. Call it right after
    /// `write_assignment` returned, so the brokers re-read a file that is already durable.
    /// Brokers that connect later get the latest announcement as soon as they connect.
    pub fn assignment_changed(&self, assignment_version: u64) {
        let epoch = self.shared.controller_epoch.load(Ordering::Acquire);
        self.shared
            .announced
            .send_replace(Some((assignment_version, epoch)));
    }

    /// The tonic service, for callers that build their own `tonic::transport::Server`. They must
    /// then call [`Self::refresh`] periodically (or run [`Self::age_loop`]) so silent brokers age
    /// out.
    pub fn service(&self) -> GrpcServer<Self> {
        GrpcServer::new(self.clone())
    }

    /// Ends every open broker stream (and any opened later). A controller that steps down
    /// calls this (`serve` does on shutdown) so its brokers notice at once instead of after the
    /// silence timeout.
    pub fn close_streams(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Re-evaluates the alive set every `ping_interval`, forever.
    pub async fn age_loop(&self) {
        let mut tick = tokio::time::interval(self.shared.config.ping_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.refresh();
        }
    }

    /// Serves heartbeats on `listener` until `shutdown` completes, aging brokers out meanwhile.
    ///
    /// HTTP/2 keepalives (1 s, 3 s timeout) close streams of brokers that vanished without a
    /// FIN, so their tasks end promptly.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), tonic::transport::Error> {
        let server = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(1)))
            .http2_keepalive_timeout(Some(Duration::from_secs(3)))
            .add_service(self.service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                shutdown.await;
                self.close_streams();
            });
        tokio::select! {
            result = server => result,
            _ = self.age_loop() => unreachable!("age_loop never returns"),
        }
    }
}

#[tonic::async_trait]
impl Heartbeat for HeartbeatServer {
    type HeartbeatStream = ReceiverStream<Result<Framed<ControllerMessage>, Status>>;

    async fn heartbeat(
        &self,
        request: Request<Streaming<Framed<BrokerStatus>>>,
    ) -> Result<Response<Self::HeartbeatStream>, Status> {
        let shared = self.shared.clone();
        let stream_id = shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let peer = request.remote_addr();
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            tracing::debug!(stream_id, ?peer, "heartbeat stream opened");
            let mut ping = tokio::time::interval(shared.config.ping_interval);
            ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut announced = shared.announced.subscribe();
            let mut closing = shared.closing.subscribe();
            if announced.borrow().is_some() {
                announced.mark_changed();
            }
            // The broker this stream speaks for: set by its first signed status, and no other
            // id may speak on it. Nothing is sent before (a message is signed for one broker).
            let mut speaks_for: Option<i32> = None;
            let reason = loop {
                if *closing.borrow_and_update() {
                    break "controller closing";
                }
                let message = tokio::select! {
                    _ = closing.changed() => continue,
                    _ = ping.tick() => shared.ping(0),
                    changed = announced.changed() => {
                        if changed.is_err() {
                            break "server dropped";
                        }
                        let Some((assignment_version, controller_epoch)) =
                            *announced.borrow_and_update()
                        else {
                            continue;
                        };
                        ControllerMessage {
                            kind: Some(Kind::AssignmentChanged(AssignmentChanged {
                                assignment_version,
                                controller_epoch,
                            })),
                            ..Default::default()
                        }
                    }
                    status = inbound.message() => match status {
                        Ok(Some(status)) => {
                            if let Some(key) = &shared.config.key {
                                let claimed = status.message.broker_id;
                                let verdict = key.verify_status(&status).map_err(|e| e.to_string()).and_then(|()| {
                                    match speaks_for {
                                        Some(b) if b != claimed => Err(format!("stream of broker {b} spoke as broker {claimed}")),
                                        _ => Ok(()),
                                    }
                                });
                                if let Err(e) = verdict {
                                    super::auth::refused(&format!("refusing a heartbeat stream from {peer:?} claiming broker {claimed}: {e}"));
                                    break "refused";
                                }
                                speaks_for = Some(claimed);
                            }
                            match shared.record(stream_id, status.message) {
                                Some(ack) => ack,
                                None => continue,
                            }
                        }
                        Ok(None) => break "broker closed the stream",
                        Err(_) => break "stream error",
                    },
                };
                let message = match &shared.config.key {
                    Some(key) => {
                        let Some(broker) = speaks_for else { continue };
                        key.sign_message(message, broker)
                    }
                    None => Framed::new(message),
                };
                match tx.try_send(Ok(message)) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                    Err(mpsc::error::TrySendError::Closed(_)) => break "response stream dropped",
                }
            };
            tracing::debug!(stream_id, ?peer, reason, "heartbeat stream closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
