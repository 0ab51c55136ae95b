//! A small pipelined Kafka client connection.
//!
//! Frames are a 4-byte big-endian size followed by a request header (v1 or v2, as
//! `ApiKey::request_header_version` says) and the body. Kafka answers the requests of one
//! connection in order, so the connection keeps the reply slots in a FIFO: the writer task
//! forwards each slot to the reader task *before* writing the frame, and the reader pairs every
//! response with the next slot and checks the correlation id. Several requests may be in flight;
//! a semaphore bounds how many.
//!
//! Versions are negotiated once per connection from the broker's ApiVersions answer: for each API
//! the highest version both sides (and the caller's cap) support.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use kaas_wire::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kaas_wire::kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Responses larger than this are refused rather than allocated.
const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;

/// A response frame and the bench-clock time it was read off the socket.
type ReplySlot = (i32, oneshot::Sender<Result<(Bytes, u64)>>);

struct Outgoing {
    frame: BytesMut,
    reply: Option<ReplySlot>,
}

/// One TCP connection to one broker.
pub struct Connection {
    addr: String,
    client_id: StrBytes,
    tx: mpsc::Sender<Outgoing>,
    next_correlation_id: AtomicI32,
    in_flight: Arc<Semaphore>,
    versions: HashMap<i16, (i16, i16)>,
}

/// A request on the wire whose response has not been read yet.
pub struct PendingResponse<R: Request> {
    rx: Option<oneshot::Receiver<Result<(Bytes, u64)>>>,
    version: i16,
    _permit: OwnedSemaphorePermit,
    _marker: std::marker::PhantomData<fn() -> R>,
}

impl<R: Request> PendingResponse<R> {
    /// Waits for the response and decodes it. A request sent without a response (produce with
    /// acks=0) yields `None`.
    pub async fn wait(self) -> Result<Option<R::Response>> {
        Ok(self.wait_timed().await?.map(|(r, _)| r))
    }

    /// Like [`PendingResponse::wait`], with the time (bench clock, ns) the response arrived.
    pub async fn wait_timed(self) -> Result<Option<(R::Response, u64)>> {
        let Some(rx) = self.rx else {
            return Ok(None);
        };
        let (frame, received_ns) = rx.await.map_err(|_| anyhow!("connection closed"))??;
        decode_response::<R>(frame, self.version).map(|r| Some((r, received_ns)))
    }
}

fn decode_response<R: Request>(mut frame: Bytes, version: i16) -> Result<R::Response> {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    ResponseHeader::decode(&mut frame, header_version)
        .with_context(|| format!("decoding response header of api {}", R::KEY))?;
    <R::Response as Decodable>::decode(&mut frame, version)
        .with_context(|| format!("decoding response of api {} v{version}", R::KEY))
}

/// Encodes a size-prefixed request frame.
pub fn encode_frame<R: Request>(
    request: &R,
    version: i16,
    correlation_id: i32,
    client_id: &StrBytes,
) -> Result<BytesMut> {
    let mut header = RequestHeader::default();
    header.request_api_key = R::KEY;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = Some(client_id.clone());
    let header_version = <R as HeaderVersion>::header_version(version);
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header.encode(&mut buf, header_version)?;
    request.encode(&mut buf, version)?;
    let size = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf)
}

impl Connection {
    /// Connects, starts the reader and writer tasks and negotiates API versions.
    pub async fn connect(addr: &str, client_id: &str, max_in_flight: usize) -> Result<Connection> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (read_half, write_half) = stream.into_split();
        let (tx, rx) = mpsc::channel::<Outgoing>(max_in_flight.max(1) * 2);
        let (slot_tx, slot_rx) = mpsc::unbounded_channel::<ReplySlot>();
        tokio::spawn(writer_loop(write_half, rx, slot_tx));
        tokio::spawn(reader_loop(read_half, slot_rx));
        let mut conn = Connection {
            addr: addr.to_string(),
            client_id: StrBytes::from_string(client_id.to_string()),
            tx,
            next_correlation_id: AtomicI32::new(1),
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            versions: HashMap::new(),
        };
        conn.versions = conn.fetch_api_versions().await?;
        Ok(conn)
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn fetch_api_versions(&self) -> Result<HashMap<i16, (i16, i16)>> {
        let mut req = ApiVersionsRequest::default();
        req.client_software_name = StrBytes::from_static_str("kaas-bench");
        req.client_software_version = StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
        // v3 is what current clients send; a broker without it answers in v0 format with
        // UNSUPPORTED_VERSION, and then we ask again in v0.
        let resp: ApiVersionsResponse = match self.send_versioned(&req, 3, true).await?.wait().await
        {
            Ok(Some(r)) if r.error_code == 0 => r,
            _ => self
                .send_versioned(&req, 0, true)
                .await?
                .wait()
                .await?
                .context("no ApiVersions response")?,
        };
        if resp.error_code != 0 {
            bail!(
                "{}: ApiVersions failed with error {}",
                self.addr,
                resp.error_code
            );
        }
        Ok(resp
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect())
    }

    /// The version to use for `R`: the highest both sides support, at most `cap`.
    pub fn version_for<R: Request>(&self, cap: i16) -> Result<i16> {
        let name = ApiKey::try_from(R::KEY)
            .map(|k| format!("{k:?}"))
            .unwrap_or_else(|_| R::KEY.to_string());
        let (broker_min, broker_max) = *self
            .versions
            .get(&R::KEY)
            .ok_or_else(|| anyhow!("{}: broker does not support {name}", self.addr))?;
        let lo = broker_min.max(R::VERSIONS.min);
        let hi = broker_max.min(R::VERSIONS.max).min(cap);
        if lo > hi {
            bail!(
                "{}: no common version of {name}: broker {broker_min}..={broker_max}, \
                 client {}..={}",
                self.addr,
                R::VERSIONS.min,
                R::VERSIONS.max.min(cap)
            );
        }
        Ok(hi)
    }

    /// Sends `request` at `version` once an in-flight slot is free; returns when the frame is
    /// queued for writing. `expect_response` is false only for produce with acks=0.
    pub async fn send_versioned<R: Request>(
        &self,
        request: &R,
        version: i16,
        expect_response: bool,
    ) -> Result<PendingResponse<R>> {
        let permit = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| anyhow!("connection closed"))?;
        self.send_with_permit(request, version, expect_response, permit)
            .await
    }

    /// Like [`Connection::send_versioned`] but returns `Ok(None)` at once when every in-flight
    /// slot is taken, so a producer can keep accumulating instead of waiting.
    pub async fn try_send_versioned<R: Request>(
        &self,
        request: &R,
        version: i16,
        expect_response: bool,
    ) -> Result<Option<PendingResponse<R>>> {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            return Ok(None);
        };
        self.send_with_permit(request, version, expect_response, permit)
            .await
            .map(Some)
    }

    /// Whether a request could be sent now without waiting.
    pub fn has_free_slot(&self) -> bool {
        self.in_flight.available_permits() > 0
    }

    async fn send_with_permit<R: Request>(
        &self,
        request: &R,
        version: i16,
        expect_response: bool,
        permit: OwnedSemaphorePermit,
    ) -> Result<PendingResponse<R>> {
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(request, version, correlation_id, &self.client_id)?;
        let (reply, rx) = if expect_response {
            let (tx, rx) = oneshot::channel();
            (Some((correlation_id, tx)), Some(rx))
        } else {
            (None, None)
        };
        self.tx
            .send(Outgoing { frame, reply })
            .await
            .map_err(|_| anyhow!("{}: connection closed", self.addr))?;
        Ok(PendingResponse {
            rx,
            version,
            _permit: permit,
            _marker: std::marker::PhantomData,
        })
    }

    /// Sends at the negotiated version (capped at `cap`) and waits for the response.
    pub async fn call<R: Request>(&self, request: &R, cap: i16) -> Result<(R::Response, i16)> {
        let version = self.version_for::<R>(cap)?;
        let resp = self
            .send_versioned(request, version, true)
            .await?
            .wait()
            .await?
            .context("missing response")?;
        Ok((resp, version))
    }
}

async fn writer_loop(
    write_half: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
    slots: mpsc::UnboundedSender<ReplySlot>,
) {
    let mut w = BufWriter::with_capacity(256 * 1024, write_half);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Coalesce whatever is already queued into one flush.
        while let Some(out) = next {
            if let Some(slot) = out.reply {
                if slots.send(slot).is_err() {
                    return;
                }
            }
            if w.write_all(&out.frame).await.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

async fn reader_loop(
    mut read_half: tokio::net::tcp::OwnedReadHalf,
    mut slots: mpsc::UnboundedReceiver<ReplySlot>,
) {
    let mut size_buf = [0u8; 4];
    // Frames are cut from one buffer. Once the previous frames are dropped, `reserve` takes
    // their memory back instead of allocating: a fresh allocation per fetch response (tens of
    // MiB, above glibc's mmap threshold) cost a page fault per 4 KiB, and those faults took
    // about a fifth of the machine during a consume, CPU the broker under test then lacked.
    let mut buf = BytesMut::new();
    loop {
        if read_half.read_exact(&mut size_buf).await.is_err() {
            return; // dropping `slots` fails every waiting request with "connection closed"
        }
        let size = i32::from_be_bytes(size_buf);
        if size < 4 || size as usize > MAX_RESPONSE_BYTES {
            if let Some((_, tx)) = slots.recv().await {
                let _ = tx.send(Err(anyhow!("invalid response size {size}")));
            }
            return;
        }
        buf.clear();
        buf.reserve(size as usize);
        buf.resize(size as usize, 0);
        let mut frame = buf.split_to(size as usize);
        if read_half.read_exact(&mut frame).await.is_err() {
            return;
        }
        let received_ns = crate::pacer::now_ns();
        let Some((correlation_id, tx)) = slots.recv().await else {
            return;
        };
        let got = i32::from_be_bytes(frame[0..4].try_into().unwrap());
        if got != correlation_id {
            let _ = tx.send(Err(anyhow!(
                "correlation id mismatch: expected {correlation_id}, got {got}"
            )));
            return;
        }
        let _ = tx.send(Ok((frame.freeze(), received_ns)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::kafka_protocol::messages::MetadataRequest;
    use kaas_wire::kafka_protocol::protocol::decode_request_header_from_buffer;

    /// A frame is size-prefixed and carries a header a broker can decode (header v2 for a
    /// flexible Metadata version, with our correlation id and client id).
    #[test]
    fn frames_are_size_prefixed_with_a_decodable_header() {
        let req = MetadataRequest::default();
        let client = StrBytes::from_static_str("bench");
        let frame = encode_frame(&req, 12, 77, &client).unwrap();
        let size = i32::from_be_bytes(frame[0..4].try_into().unwrap()) as usize;
        assert_eq!(size, frame.len() - 4);
        let mut body = frame.freeze().slice(4..);
        let header = decode_request_header_from_buffer(&mut body).unwrap();
        assert_eq!(header.request_api_key, ApiKey::Metadata as i16);
        assert_eq!(header.request_api_version, 12);
        assert_eq!(header.correlation_id, 77);
        assert_eq!(header.client_id.as_deref(), Some("bench"));
        let decoded = MetadataRequest::decode(&mut body, 12).unwrap();
        assert_eq!(decoded, req);
    }

    /// Against a scripted fake broker: versions are negotiated, pipelined requests are matched
    /// to their responses in order, and a dead connection fails the waiting request.
    #[tokio::test]
    async fn pipelined_requests_against_a_fake_broker() {
        use kaas_wire::kafka_protocol::messages::api_versions_response::ApiVersion;
        use kaas_wire::kafka_protocol::messages::MetadataResponse;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for _ in 0..4 {
                let mut size = [0u8; 4];
                s.read_exact(&mut size).await.unwrap();
                let mut buf = vec![0u8; i32::from_be_bytes(size) as usize];
                s.read_exact(&mut buf).await.unwrap();
                let mut b = Bytes::from(buf);
                let h = decode_request_header_from_buffer(&mut b).unwrap();
                seen.push((h.request_api_key, h.request_api_version));
                let mut out = BytesMut::new();
                out.put_i32(0);
                let mut rh = ResponseHeader::default();
                rh.correlation_id = h.correlation_id;
                if h.request_api_key == ApiKey::ApiVersions as i16 {
                    rh.encode(&mut out, 0).unwrap();
                    let mut r = ApiVersionsResponse::default();
                    let mut v = ApiVersion::default();
                    v.api_key = ApiKey::ApiVersions as i16;
                    v.max_version = 3;
                    r.api_keys.push(v);
                    let mut m = ApiVersion::default();
                    m.api_key = ApiKey::Metadata as i16;
                    m.max_version = 9;
                    r.api_keys.push(m);
                    r.encode(&mut out, h.request_api_version).unwrap();
                } else {
                    rh.encode(&mut out, 1).unwrap();
                    let mut r = MetadataResponse::default();
                    r.throttle_time_ms = h.correlation_id; // lets the client check pairing
                    r.encode(&mut out, h.request_api_version).unwrap();
                }
                let n = (out.len() - 4) as i32;
                out[0..4].copy_from_slice(&n.to_be_bytes());
                s.write_all(&out).await.unwrap();
            }
            seen
            // dropping `s` closes the connection
        });
        let conn = Connection::connect(&addr, "t", 4).await.unwrap();
        let v = conn.version_for::<MetadataRequest>(12).unwrap();
        assert_eq!(v, 9, "negotiated down to the broker's max");
        let req = MetadataRequest::default();
        let a = conn.send_versioned(&req, v, true).await.unwrap();
        let b = conn.send_versioned(&req, v, true).await.unwrap();
        let c = conn.send_versioned(&req, v, true).await.unwrap();
        let (ra, rb, rc) = (a.wait().await, b.wait().await, c.wait().await);
        let ids: Vec<i32> = [ra, rb, rc]
            .into_iter()
            .map(|r| r.unwrap().unwrap().throttle_time_ms)
            .collect();
        assert_eq!(ids, vec![2, 3, 4]);
        let seen = server.await.unwrap();
        assert_eq!(seen[0], (ApiKey::ApiVersions as i16, 3));
        assert!(seen[1..].iter().all(|s| *s == (ApiKey::Metadata as i16, 9)));
        // The fake broker has closed the connection: the next request fails one way or another.
        if let Ok(p) = conn.send_versioned(&req, v, true).await {
            assert!(p.wait().await.is_err());
        }
    }
}
