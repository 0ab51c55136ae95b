//! The health, readiness and metrics HTTP endpoint (`--health-listen`, default :8080).
//!
//! A deliberately tiny HTTP/1.1 server on the control thread: GET only, one response per
//! connection, bounded request size and time. What it reports comes from a [`HealthSource`]
//! that reads the shards' atomics, so serving a probe never touches a shard.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the endpoint reports. Implemented by the binary over the shards' probes.
pub trait HealthSource: Send + Sync + 'static {
    /// `/healthz`: (healthy, JSON body).
    fn healthz(&self) -> (bool, String);
    /// `/readyz`: (ready, JSON body).
    fn readyz(&self) -> (bool, String);
    /// `/metrics`: Prometheus text exposition format.
    fn metrics(&self) -> String;
}

const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, source: Arc<dyn HealthSource>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let source = source.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, source)).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "health endpoint accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, source: Arc<dyn HealthSource>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST_BYTES {
            return respond(&mut stream, 431, "text/plain", "request header too large\n").await;
        }
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return respond(&mut stream, 405, "text/plain", "only GET is served\n").await;
    }
    let path = path.split('?').next().unwrap_or("");
    match path {
        "/healthz" | "/readyz" => {
            let (ok, body) = if path == "/healthz" {
                source.healthz()
            } else {
                source.readyz()
            };
            respond(
                &mut stream,
                if ok { 200 } else { 503 },
                "application/json",
                &body,
            )
            .await
        }
        "/metrics" => {
            respond(
                &mut stream,
                200,
                "text/plain; version=0.0.4",
                &source.metrics(),
            )
            .await
        }
        _ => {
            respond(
                &mut stream,
                404,
                "text/plain",
                "not found: try /healthz, /readyz or /metrics\n",
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!("HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
