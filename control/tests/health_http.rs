//! The health endpoint's HTTP behaviour on 127.0.0.1 with a fake [`HealthSource`]: methods,
//! HEAD, keep-alive, content negotiation on `/metrics`, and the limits on header size, header
//! time and open connections. A raw TCP client, so every byte the server writes is seen.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kaas_control::health::{serve, HealthSource, Limits};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct FakeSource;

impl HealthSource for FakeSource {
    fn healthz(&self) -> (bool, String) {
        (true, r#"{"status":"ok"}"#.into())
    }
    fn readyz(&self) -> (bool, String) {
        (false, r#"{"ready":false}"#.into())
    }
    fn metrics(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register("fake_requests", "Requests", ConstCounter::new(3u64));
        registry
    }
}

async fn start(limits: Limits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, Arc::new(FakeSource), limits));
    addr
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 connection, read exactly as far as each response goes.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, method: &str, path: &str, extra_headers: &str) -> Answer {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n{extra_headers}\r\n");
        self.stream.write_all(request.as_bytes()).await.unwrap();
        self.answer(method == "HEAD").await
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk))
            .await
            .expect("the server answered within 5 s")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// The next response; a HEAD response's Content-Length announces a body that is not sent.
    async fn answer(&mut self, head_only: bool) -> Answer {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(self.fill().await > 0, "connection closed before a response");
        };
        let head = String::from_utf8(self.buf.drain(..end).collect()).unwrap();
        let mut lines = head.lines();
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let mut answer = Answer {
            status,
            headers,
            body: String::new(),
        };
        let length: usize = answer
            .header("content-length")
            .map_or(0, |v| v.parse().unwrap());
        if !head_only {
            while self.buf.len() < length {
                assert!(self.fill().await > 0, "connection closed inside a body");
            }
            answer.body = String::from_utf8(self.buf.drain(..length).collect()).unwrap();
        }
        answer
    }

    /// Whether the server closes the connection within `within`, with nothing more sent.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(within, self.stream.read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

// HEAD answers the GET's status and headers and no body: the next response on the same
// connection starts right where the HEAD response's headers end.
#[tokio::test]
async fn head_has_no_body_and_keep_alive_serves_the_next_request() {
    let addr = start(Limits::default()).await;
    let mut client = Client::connect(addr).await;
    let head = client.send("HEAD", "/healthz", "").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("application/json"));
    assert_eq!(head.header("content-length"), Some("15"));
    let get = client.send("GET", "/healthz", "").await;
    assert_eq!((get.status, get.body.as_str()), (200, r#"{"status":"ok"}"#));
    let ready = client.send("GET", "/readyz", "").await;
    assert_eq!(ready.status, 503);
    assert!(client.buf.is_empty(), "bytes after the last response");
}

// Only GET and HEAD are served; others get 405 with Allow, unknown paths a 404 naming the
// paths there are.
#[tokio::test]
async fn other_methods_and_unknown_paths_are_refused_helpfully() {
    let addr = start(Limits::default()).await;
    let mut client = Client::connect(addr).await;
    let post = client
        .send("POST", "/metrics", "Content-Length: 0\r\n")
        .await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    let missing = client.send("GET", "/nope", "").await;
    assert_eq!(missing.status, 404);
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert!(missing.body.contains(path), "{}", missing.body);
    }
}

// /metrics is the classic text format by default and OpenMetrics when Accept asks for it.
#[tokio::test]
async fn metrics_follow_accept() {
    let addr = start(Limits::default()).await;
    let mut client = Client::connect(addr).await;
    let text = client.send("GET", "/metrics", "").await;
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        text.body.contains("# TYPE fake_requests_total counter\n"),
        "{}",
        text.body
    );
    assert!(
        text.body.contains("\nfake_requests_total 3\n"),
        "{}",
        text.body
    );
    assert!(!text.body.contains("# EOF"), "{}", text.body);
    let open = client
        .send(
            "GET",
            "/metrics",
            "Accept: application/openmetrics-text\r\n",
        )
        .await;
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(
        open.body.contains("# TYPE fake_requests counter\n"),
        "{}",
        open.body
    );
    assert!(
        open.body.contains("\nfake_requests_total 3\n"),
        "{}",
        open.body
    );
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);
}

// A request whose headers exceed the limit is answered 431, not buffered.
#[tokio::test]
async fn oversized_headers_are_refused() {
    let addr = start(Limits::default()).await;
    let mut client = Client::connect(addr).await;
    let big = format!("X-Filler: {}\r\n", "a".repeat(9 * 1024));
    let answer = client.send("GET", "/healthz", &big).await;
    assert_eq!(answer.status, 431);
}

// A client that sends no request, or only part of its headers, is disconnected after the
// header read timeout, and so is a keep-alive connection left idle.
#[tokio::test]
async fn slow_and_idle_clients_are_disconnected() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let addr = start(limits).await;
    let mut silent = Client::connect(addr).await;
    let mut partial = Client::connect(addr).await;
    partial
        .stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let mut idle = Client::connect(addr).await;
    assert_eq!(idle.send("GET", "/healthz", "").await.status, 200);
    let started = Instant::now();
    for client in [&mut silent, &mut partial, &mut idle] {
        assert!(client.closed_within(Duration::from_secs(3)).await);
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

// Beyond the connection limit a new connection is closed at once; a freed slot is reused.
#[tokio::test]
async fn connections_beyond_the_limit_are_closed() {
    let limits = Limits {
        connections: 1,
        ..Limits::default()
    };
    let addr = start(limits).await;
    let mut first = Client::connect(addr).await;
    assert_eq!(first.send("GET", "/healthz", "").await.status, 200);
    let mut second = Client::connect(addr).await;
    assert!(second.closed_within(Duration::from_secs(3)).await);
    drop(first);
    // The server notices the close on its own schedule; retry briefly.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut third = Client::connect(addr).await;
        let request = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";
        if third.stream.write_all(request).await.is_ok() && third.fill().await > 0 {
            assert!(third.buf.starts_with(b"HTTP/1.1 200"));
            break;
        }
        assert!(Instant::now() < deadline, "the freed slot was never reused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
