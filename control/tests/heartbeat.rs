//! The heartbeat server and client over real tonic streams on 127.0.0.1, with short timings so
//! every test finishes in a few seconds. Every wait is bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kaas_control::balancer::{AliveBrokers, BrokerId};
use kaas_control::heartbeat::{
    ClientConfig, ControllerEvent, HeartbeatClient, HeartbeatServer, LocalStatus, ServerConfig,
};
use kaas_control::lease::Leadership;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(5);

fn server_config() -> ServerConfig {
    ServerConfig {
        ping_interval: Duration::from_millis(200),
        alive_timeout: Duration::from_secs(1),
        pinned: None,
        leadership: None,
        key: None,
    }
}

fn client_config() -> ClientConfig {
    ClientConfig {
        status_interval: Duration::from_millis(200),
        min_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(400),
        connect_timeout: Duration::from_secs(1),
        silence_timeout: Duration::from_secs(2),
        send_partition_list: false,
        key: None,
    }
}

struct RunningServer {
    server: HeartbeatServer,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningServer {
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("server stops within the bound")
            .expect("server task");
    }
}

async fn start_server_on(addr: &str, epoch: u64) -> RunningServer {
    start_server_with(addr, server_config(), epoch).await
}

async fn start_server_with(addr: &str, config: ServerConfig, epoch: u64) -> RunningServer {
    let listener = TcpListener::bind(addr).await.expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let server = HeartbeatServer::new(config, epoch);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    let task = tokio::spawn(async move {
        task.await.expect("serve task").expect("serve");
    });
    RunningServer {
        server,
        addr,
        stop: Some(stop),
        task,
    }
}

async fn start_server(epoch: u64) -> RunningServer {
    start_server_on("127.0.0.1:0", epoch).await
}

struct Broker {
    status: watch::Sender<LocalStatus>,
    events: mpsc::Receiver<ControllerEvent>,
    task: JoinHandle<()>,
    _controller: Option<watch::Sender<Option<String>>>,
}

fn start_broker(id: i32, controller: watch::Receiver<Option<String>>) -> Broker {
    let (status, status_rx) =
        watch::channel(LocalStatus::new(BrokerId(id), format!("b{id}"), 9092));
    let (task, events) = HeartbeatClient::spawn(client_config(), controller, status_rx);
    Broker {
        status,
        events,
        task,
        _controller: None,
    }
}

fn start_broker_at(id: i32, addr: SocketAddr) -> Broker {
    let (tx, rx) = watch::channel(Some(addr.to_string()));
    let mut broker = start_broker(id, rx);
    broker._controller = Some(tx);
    broker
}

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn wait_alive(rx: &mut watch::Receiver<AliveBrokers>, want: &[i32]) {
    let want: Vec<BrokerId> = want.iter().map(|&i| BrokerId(i)).collect();
    bounded(&format!("alive set {want:?}"), async {
        rx.wait_for(|alive| alive.keys().copied().eq(want.iter().copied()))
            .await
            .expect("server alive");
    })
    .await;
}

/// Waits for the first event matching `pred`, skipping others.
async fn wait_event(
    events: &mut mpsc::Receiver<ControllerEvent>,
    what: &str,
    pred: impl Fn(&ControllerEvent) -> bool,
) -> ControllerEvent {
    bounded(what, async {
        loop {
            let event = events.recv().await.expect("client running");
            if pred(&event) {
                return event;
            }
        }
    })
    .await
}

// Three brokers join the alive set; a draining one leaves it at once; a silent one ages out
// only after the timeout, not the moment its stream closes.
#[tokio::test]
async fn alive_set_tracks_join_drain_and_disconnect() {
    let server = start_server(1).await;
    let mut alive = server.server.alive();
    let b0 = start_broker_at(0, server.addr);
    let b1 = start_broker_at(1, server.addr);
    let b2 = start_broker_at(2, server.addr);
    wait_alive(&mut alive, &[0, 1, 2]).await;

    b1.status.send_modify(|s| s.draining = true);
    wait_alive(&mut alive, &[0, 2]).await;

    b2.task.abort();
    let gone = Instant::now();
    wait_alive(&mut alive, &[0]).await;
    let aged = gone.elapsed();
    assert!(
        aged >= Duration::from_millis(500),
        "left after {aged:?}: must age out by timeout (1 s), not on disconnect"
    );
    let rows = server.server.broker_rows(&[]);
    let health: Vec<_> = rows.iter().map(|r| (r.id.0, r.health)).collect();
    use kaas_control::assignment::Health::*;
    assert_eq!(health, vec![(0, Alive), (1, Draining), (2, Dead)]);
    drop((b0, b1));
    server.stop().await;
}

// ASSIGNMENT_CHANGED reaches every connected broker, with the controller's epoch.
#[tokio::test]
async fn assignment_changed_reaches_every_client() {
    let server = start_server(7).await;
    let mut alive = server.server.alive();
    let mut brokers: Vec<Broker> = (0..3).map(|i| start_broker_at(i, server.addr)).collect();
    wait_alive(&mut alive, &[0, 1, 2]).await;
    for b in &mut brokers {
        let ping = wait_event(&mut b.events, "ping", |e| {
            matches!(e, ControllerEvent::Ping { .. })
        })
        .await;
        assert!(
            matches!(
                ping,
                ControllerEvent::Ping {
                    controller_epoch: 7,
                    ..
                }
            ),
            "{ping:?}"
        );
    }
    server.server.assignment_changed(42);
    for b in &mut brokers {
        wait_event(&mut b.events, "assignment changed", |e| {
            *e == ControllerEvent::AssignmentChanged {
                assignment_version: 42,
                controller_epoch: 7,
            }
        })
        .await;
    }
    // A broker connecting later learns the latest version as soon as it connects.
    let mut late = start_broker_at(3, server.addr);
    wait_event(&mut late.events, "assignment changed on connect", |e| {
        matches!(
            e,
            ControllerEvent::AssignmentChanged {
                assignment_version: 42,
                ..
            }
        )
    })
    .await;
    server.stop().await;
}

// When the controller address changes, the client drops the old stream and dials the new one.
#[tokio::test]
async fn client_follows_controller_change() {
    let a = start_server(1).await;
    let b = start_server(2).await;
    let (controller, controller_rx) = watch::channel(Some(a.addr.to_string()));
    let mut broker = start_broker(0, controller_rx);
    let mut alive_a = a.server.alive();
    let mut alive_b = b.server.alive();
    wait_alive(&mut alive_a, &[0]).await;
    wait_event(&mut broker.events, "connected to a", |e| {
        *e == ControllerEvent::Connected {
            addr: a.addr.to_string(),
        }
    })
    .await;

    controller.send_replace(Some(b.addr.to_string()));
    wait_alive(&mut alive_b, &[0]).await;
    wait_event(&mut broker.events, "connected to b", |e| {
        *e == ControllerEvent::Connected {
            addr: b.addr.to_string(),
        }
    })
    .await;
    wait_event(&mut broker.events, "ping from epoch 2", |e| {
        matches!(
            e,
            ControllerEvent::Ping {
                controller_epoch: 2,
                ..
            }
        )
    })
    .await;
    // The old controller no longer hears from it and ages it out.
    wait_alive(&mut alive_a, &[]).await;
    a.stop().await;
    b.stop().await;
}

// A broken stream (controller restarted on the same address) is re-dialled with backoff.
#[tokio::test]
async fn client_redials_after_the_stream_breaks() {
    let first = start_server(1).await;
    let addr = first.addr;
    let mut broker = start_broker_at(0, addr);
    wait_event(&mut broker.events, "connected", |e| {
        matches!(e, ControllerEvent::Connected { .. })
    })
    .await;
    first.stop().await;
    wait_event(&mut broker.events, "disconnected", |e| {
        matches!(e, ControllerEvent::Disconnected { .. })
    })
    .await;

    let second = start_server_on(&addr.to_string(), 2).await;
    let mut alive = second.server.alive();
    wait_alive(&mut alive, &[0]).await;
    wait_event(
        &mut broker.events,
        "ping from the restarted controller",
        |e| {
            matches!(
                e,
                ControllerEvent::Ping {
                    controller_epoch: 2,
                    ..
                }
            )
        },
    )
    .await;
    second.stop().await;
}

// With no controller known the client waits, and dials as soon as one is announced.
#[tokio::test]
async fn client_waits_for_a_controller() {
    let server = start_server(3).await;
    let (controller, controller_rx) = watch::channel(None);
    let mut broker = start_broker(5, controller_rx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        broker.events.try_recv().is_err(),
        "no events without a controller"
    );
    controller.send_replace(Some(server.addr.to_string()));
    let mut alive = server.server.alive();
    wait_alive(&mut alive, &[5]).await;
    server.stop().await;
}

// Statuses are acknowledged with the instant they were sent (the start of the broker's write
// fence), and only while the controller's Lease is valid at the moment of sending: a controller
// whose deadline passed must not extend any broker's fence.
#[tokio::test]
async fn statuses_are_acknowledged_only_while_the_lease_is_valid() {
    let (leadership_tx, leadership) = watch::channel(Leadership {
        leader: true,
        holder: Some("0@c".into()),
        epoch: 3,
        leader_until: Some(tokio::time::Instant::now() + Duration::from_secs(60)),
        expired_holder: None,
    });
    let config = ServerConfig {
        leadership: Some(leadership),
        ..server_config()
    };
    let server = start_server_with("127.0.0.1:0", config, 3).await;
    let mut broker = start_broker_at(0, server.addr);
    // A broker still on a file of an older controller is not acknowledged (AckFloor).
    broker.status.send_modify(|s| {
        s.applied_controller_epoch = 2;
        s.applied_assignment_version = 40;
    });
    expect_no_ack(&mut broker, "a broker on an older controller's file").await;
    let set_applied = |broker: &Broker, version: u64| {
        broker.status.send_modify(|s| {
            s.applied_controller_epoch = 3;
            s.applied_assignment_version = version;
        })
    };
    set_applied(&broker, 1);
    let before = tokio::time::Instant::now();
    let ack = wait_event(&mut broker.events, "an acknowledgement", |e| {
        matches!(
            e,
            ControllerEvent::Ping {
                acked_sent_at: Some(_),
                ..
            }
        )
    })
    .await;
    let ControllerEvent::Ping {
        acked_sent_at: Some(sent),
        ..
    } = ack
    else {
        unreachable!()
    };
    assert!(sent >= before && sent <= tokio::time::Instant::now());

    // File 3/5 takes a partition from broker 0: no acknowledgement until it applied 3/5.
    server.server.require_applied(BrokerId(0), (3, 5));
    set_applied(&broker, 4);
    expect_no_ack(
        &mut broker,
        "a broker that has not applied the file that moved its partitions",
    )
    .await;
    set_applied(&broker, 5);
    wait_event(
        &mut broker.events,
        "an acknowledgement after applying",
        |e| {
            matches!(
                e,
                ControllerEvent::Ping {
                    acked_sent_at: Some(_),
                    ..
                }
            )
        },
    )
    .await;

    // The deadline passes (as after a pause): plain PINGs may still go out, acks may not.
    leadership_tx.send_modify(|l| l.leader_until = Some(tokio::time::Instant::now()));
    while broker.events.try_recv().is_ok() {}
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1_500);
    let mut pings = 0;
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, broker.events.recv()).await {
        if let ControllerEvent::Ping { acked_sent_at, .. } = event {
            assert_eq!(acked_sent_at, None, "acknowledged after the lease deadline");
            pings += 1;
        }
    }
    assert!(pings > 0, "the stream stayed up and pinged");
    broker.task.abort();
    server.stop().await;
}

/// Waits 1.5 s (past a status interval) and asserts that no PING acknowledged a status sent
/// after the wait began.
async fn expect_no_ack(broker: &mut Broker, what: &str) {
    // Statuses already in flight (or acknowledged) before the change may still be acked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while broker.events.try_recv().is_ok() {}
    let from = tokio::time::Instant::now();
    let deadline = from + Duration::from_millis(1_500);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, broker.events.recv()).await {
        if let ControllerEvent::Ping {
            acked_sent_at: Some(sent),
            ..
        } = event
        {
            assert!(sent < from, "{what} was acknowledged");
        }
    }
}

// Proves (issue 13, item 4): with a cluster key, a broker holding it registers, while a
// stranger without it — a forged status registering a fake broker 7 with its own address, or
// impersonating broker 1 as draining from another host — is refused: its stream is closed,
// nothing of it reaches the registry, and the refusal is counted.
#[tokio::test]
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
async fn forged_statuses_are_refused_and_signed_ones_accepted() {
    use kaas_control::heartbeat::auth::{ClusterKey, REFUSED};
    use kaas_proto::framed::Framed;
    use kaas_proto::heartbeat::heartbeat_client::HeartbeatClient as GrpcClient;
    use kaas_proto::heartbeat::BrokerStatus;

    let key = ClusterKey::from_bytes(b"this cluster's key: 32 bytes ok!");
    let server = start_server_with(
        "127.0.0.1:0",
        ServerConfig {
            key: Some(key.clone()),
            ..server_config()
        },
        1,
    )
    .await;
    let mut alive = server.server.alive();
    let (tx, rx) = watch::channel(Some(server.addr.to_string()));
    let (status, status_rx) = watch::channel(LocalStatus::new(BrokerId(1), "b1", 9092));
    let (task, mut events) = HeartbeatClient::spawn(
        ClientConfig {
            key: Some(key.clone()),
            ..client_config()
        },
        rx,
        status_rx,
    );
    wait_alive(&mut alive, &[1]).await;
    wait_event(&mut events, "a signed acknowledgement", |e| {
        matches!(
            e,
            ControllerEvent::Ping {
                acked_sent_at: Some(_),
                ..
            }
        )
    })
    .await;

    let refused_before = REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    let stranger = ClusterKey::from_bytes(b"a stranger's guess at the key!!!");
    let forgeries = [
        // Unsigned: a fake broker 7 advertising the forger's address.
        Framed::new(BrokerStatus {
            broker_id: 7,
            advertised_host: "203.0.113.7".into(),
            advertised_port: 9092,
            healthy: true,
            sequence: 1,
            ..Default::default()
        }),
        // Signed with another key: broker 1, draining, another host, a large sequence.
        stranger.sign_status(BrokerStatus {
            broker_id: 1,
            advertised_host: "203.0.113.7".into(),
            advertised_port: 9092,
            healthy: true,
            draining: true,
            sequence: 1 << 40,
            ..Default::default()
        }),
    ];
    for forged in forgeries {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let (ftx, frx) = mpsc::channel(4);
        ftx.send(forged).await.unwrap();
        let mut inbound = GrpcClient::new(channel)
            .heartbeat(tokio_stream::wrappers::ReceiverStream::new(frx))
            .await
            .expect("stream opens")
            .into_inner();
        // The controller sends nothing to an unproven stream and closes it.
        let first = bounded("the forged stream to close", inbound.message()).await;
        assert!(
            matches!(first, Ok(None) | Err(_)),
            "the forger got a message: {first:?}"
        );
    }
    server.server.refresh();
    let registry = server.server.registry();
    let rows = server.server.broker_rows(&[]);
    assert_eq!(
        rows.iter().map(|r| r.id.0).collect::<Vec<_>>(),
        vec![1],
        "{registry:?}"
    );
    assert_eq!(rows[0].host, "b1", "the forger changed broker 1's address");
    assert_eq!(rows[0].health, kaas_control::assignment::Health::Alive);
    assert!(REFUSED.load(std::sync::atomic::Ordering::Relaxed) >= refused_before + 2);
    drop((status, tx));
    task.abort();
    server.stop().await;
}
