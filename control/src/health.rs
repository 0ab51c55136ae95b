//! The health, readiness and metrics HTTP endpoint (`--health-listen`, default :8080).
//!
//! HTTP/1.1 served by hyper on the control thread: GET and HEAD only, keep-alive allowed, every
//! connection bounded in header size and in time (the header read timeout also closes a
//! keep-alive connection left idle), and at most [`Limits::connections`] open at once. What it
//! reports comes from a [`HealthSource`] that reads the shards' atomics, so serving a probe
//! never touches a shard. `/metrics` speaks OpenMetrics to a client that asks for it in `Accept`
//! and the classic Prometheus text format (0.0.4) to everyone else.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE, VARY};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// What the endpoint reports. Implemented by the binary over the shards' probes.
pub trait HealthSource: Send + Sync + 'static {
    /// `/healthz`: (healthy, JSON body).
    fn healthz(&self) -> (bool, String);
    /// `/readyz`: (ready, JSON body).
    fn readyz(&self) -> (bool, String);
    /// `/metrics`: every metric family as of now. The endpoint chooses the encoding.
    fn metrics(&self) -> Registry;
}

/// How much one client may cost the control thread.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; one more is closed as soon as it is accepted, so a flood of
    /// clients cannot hold the control thread's memory or file descriptors.
    pub connections: usize,
    /// A request's start line and headers, in bytes (a larger one is answered 431).
    pub header_bytes_max: usize,
    /// Time a client has to send a request's headers; it runs from the moment the server waits
    /// for a request, so it also closes a keep-alive connection that stays idle this long.
    pub header_read_timeout: Duration,
    /// Time after which a connection is told to close once its current response is written,
    /// and then given [`Limits::header_read_timeout`] more before it is dropped: a client that
    /// stops reading its responses cannot hold a connection slot for ever.
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 64,
            header_bytes_max: 8 * 1024,
            header_read_timeout: Duration::from_secs(5),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, source: Arc<dyn HealthSource>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.header_bytes_max)
        // hyper's floor for its read buffer is 8 KiB; the header limit above is the real bound.
        .max_buf_size(limits.header_bytes_max.max(8 * 1024) + 8 * 1024);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "health endpoint accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(
                max = limits.connections,
                "health endpoint connection closed: too many open"
            );
            continue;
        };
        let http = http.clone();
        let source = source.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            connection(&http, stream, source, &limits).await;
            drop(slot);
        });
    }
}

/// Serves one connection until the client closes it, a limit closes it, or its lifetime ends.
async fn connection(
    http: &http1::Builder,
    stream: TcpStream,
    source: Arc<dyn HealthSource>,
    limits: &Limits,
) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let response = answer(source.as_ref(), &req);
        async move { Ok::<_, Infallible>(response) }
    });
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = tokio::time::sleep(limits.connection_lifetime) => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(limits.header_read_timeout, conn.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "health endpoint connection ended");
    }
}

/// The response to one request. A HEAD request gets the GET response: hyper writes its status
/// and headers (with the GET body's Content-Length) and never the body.
fn answer(source: &dyn HealthSource, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served\n",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match req.uri().path() {
        "/healthz" => json(source.healthz()),
        "/readyz" => json(source.readyz()),
        "/metrics" => {
            let accept: Vec<&str> = req
                .headers()
                .get_all(ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            let format = MetricsFormat::negotiate(&accept.join(","));
            let mut response = match format.encode(&source.metrics()) {
                Ok(text) => body(StatusCode::OK, format.content_type(), text),
                Err(_) => plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the metrics could not be encoded\n",
                ),
            };
            response
                .headers_mut()
                .insert(VARY, HeaderValue::from_static("Accept"));
            response
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: this endpoint serves /healthz (liveness, JSON), /readyz (readiness, \
             JSON) and /metrics (Prometheus text, or OpenMetrics on Accept: \
             application/openmetrics-text)\n",
        ),
    }
}

fn json((ok, text): (bool, String)) -> Response<Full<Bytes>> {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    body(status, "application/json", text)
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    body(status, "text/plain; charset=utf-8", text)
}

fn body(
    status: StatusCode,
    content_type: &'static str,
    text: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(text.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsFormat {
    /// OpenMetrics 1.0.0 text: counter families named without `_total`, `# UNIT`, `# EOF`.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4, which every scraper reads.
    PrometheusText,
}

impl MetricsFormat {
    /// The format for an `Accept` header (several joined with commas; empty when absent):
    /// OpenMetrics when the client ranks `application/openmetrics-text` above zero and at least
    /// as high as every plain-text or wildcard range it lists, the classic text otherwise.
    pub fn negotiate(accept: &str) -> Self {
        let (mut openmetrics_q, mut text_q) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics_q = openmetrics_q.max(q),
                "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
                _ => {}
            }
        }
        if openmetrics_q > 0.0 && openmetrics_q >= text_q {
            MetricsFormat::OpenMetrics
        } else {
            MetricsFormat::PrometheusText
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            MetricsFormat::OpenMetrics => {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
            MetricsFormat::PrometheusText => {
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE
            }
        }
    }

    /// `registry` in this format (OpenMetrics ends with its `# EOF` line).
    pub fn encode(self, registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        match self {
            MetricsFormat::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, registry)?;
            }
            MetricsFormat::PrometheusText => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?;
            }
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::MetricsFormat::{self, OpenMetrics, PrometheusText};

    // A client gets OpenMetrics only when it asks for it at least as strongly as for text.
    #[test]
    fn negotiate_follows_accept_and_its_weights() {
        let cases = [
            ("", PrometheusText),
            ("*/*", PrometheusText),
            ("text/plain", PrometheusText),
            ("application/json", PrometheusText),
            ("application/openmetrics-text", OpenMetrics),
            ("Application/OpenMetrics-Text; version=1.0.0", OpenMetrics),
            // Prometheus 2.x's scrape header.
            (
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                OpenMetrics,
            ),
            (
                "text/plain;version=0.0.4,application/openmetrics-text;q=0.5",
                PrometheusText,
            ),
            ("application/openmetrics-text;q=0", PrometheusText),
            ("*/*, application/openmetrics-text", OpenMetrics),
        ];
        for (accept, want) in cases {
            assert_eq!(MetricsFormat::negotiate(accept), want, "Accept: {accept:?}");
        }
    }
}
