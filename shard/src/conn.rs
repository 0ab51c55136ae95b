//! One client connection: read frames, dispatch, write responses in request order.
//!
//! A connection's requests take effect in the order they arrived, as Kafka's network layer
//! guarantees by handling one request per connection at a time: librdkafka's default producer
//! (no idempotence, a deep in-flight window) and Java producers with `max.in.flight > 1` rely
//! on it for per-partition order, and idempotent producers rely on it to avoid
//! OUT_OF_ORDER_SEQUENCE_NUMBER. So a request is dispatched only after the previous one's
//! *effects* are done ([`EffectGate`]), which is when its handler returns. A Produce after a
//! Produce waits less: only until the earlier one's appends are queued in order on their
//! owning shards (`crate::turns`), since its own appends then queue behind them. So a
//! producer's appends, and its acks=all requests' waits for the group-commit sync (which nobody
//! can observe except through the response), overlap with its next requests; before this, a
//! producer whose partition lives on another shard paid one cross-shard round trip per
//! request. Any other request waits until every earlier request is done. Responses leave in
//! request order: each request runs as its own task and the writer awaits those tasks in
//! arrival order. Answers that are ready one after another are gathered and written with one
//! `send`; the writer writes out what it gathered before it waits for anything, so no answer
//! waits for a later request. At most [`MAX_IN_FLIGHT`] requests per connection are in
//! progress; beyond that the reader waits.
//!
//! Record sets that are slices of a segment mapping (`kaas_storage::resident::with_file_backing`)
//! are written with `sendfile`, so the kernel hands page-cache pages to the socket and the
//! broker copies nothing; everything else is written from memory. The socket is non-blocking
//! so that `sendfile` on a full socket returns instead of waiting for the client. A window of
//! a record set with pages not in the page cache — history — is read past the page cache
//! (`kaas_storage::direct`) on the shard's blocking threads while the windows before it are
//! written ([`write_frame`]): the shard's other connections must not wait for the disk, and
//! pages read once must not fill the page cache that a pod's memory limit counts. Failing
//! that, it is sent with `sendfile` from a blocking thread, which reads them synchronously.
//!
//! What a connection may hold is bounded ([`crate::admission`]): a request body's memory is
//! reserved from the broker-wide budget as its bytes arrive, and the reader stops reading while
//! the budget is exhausted. A connection with no request for `connections.max.idle.ms` is
//! closed, and so is one whose request body stops arriving (each 64 KiB of it, or its rest,
//! within `--request-progress-timeout-ms`) — a client that declares a large frame and trickles
//! it cannot keep a connection and its memory forever.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use futures::FutureExt;
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::Task;
use kaas_wire::codec::{self, decode_request};
use kaas_wire::fetch_frame::ResponseFrame;
use kaas_wire::frame::{frame_len, FRAME_PREFIX_LEN};
use kaas_wire::kafka_protocol::messages::ApiKey;
use kaas_wire::WireError;

use crate::admission::{Admission, ConnPermit, Reservation, FIRST_CHUNK_BYTES};
use crate::handlers::{self, EffectGate, Effects};
use crate::probe::{PROCESS, QUEUE, SEND};
use crate::shard::Shard;

/// Requests per connection being served at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// A request body must arrive at least this many bytes (or its rest) per
/// `--request-progress-timeout-ms`.
const PROGRESS_STEP_BYTES: usize = 64 * 1024;
/// Read buffer per connection.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// A request body's remainder this large is read past the read buffer (see
/// `read_exact_past_buffer`).
const DIRECT_READ_MIN_BYTES: usize = 16 * 1024;

/// Serves one accepted connection; `_permit` is its admission slot, given back when it ends.
pub async fn serve(shard: Rc<Shard>, stream: TcpStream, _permit: ConnPermit) {
    let peer_addr = stream.peer_addr().ok();
    let peer = peer_addr.map_or_else(|| "?".into(), |a| a.to_string());
    // As Kafka names a group member's host (`/127.0.0.1`); tools show it in group descriptions.
    let client_host: Rc<str> = peer_addr
        .map_or_else(|| "/unknown".into(), |a| format!("/{}", a.ip()))
        .into();
    let _ = stream.set_nodelay(true);
    let socket = stream.as_raw_fd();
    // Non-blocking, so that `sendfile` returns when the socket is full instead of waiting for
    // the client (it still reads uncached file pages synchronously, which is why those are sent
    // from the shard's blocking thread: `send_file`). glommio's own reads and writes are
    // `recv`/`send` with MSG_DONTWAIT and io_uring polls for readiness, which the flag does not
    // change.
    let zero_copy = set_nonblocking(socket);
    shard.probe.connections_open.fetch_add(1, Ordering::Relaxed);
    shard
        .probe
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    let (reader, writer) = stream.split();
    let (tx, rx) = local_channel::new_bounded::<Task<Served>>(MAX_IN_FLIGHT);
    let probe = shard.probe.clone();
    let writer_task = glommio::spawn_local(async move {
        let mut writer = futures::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
        let mut broken = false;
        loop {
            // Responses already answered go out together: a producer with requests in flight
            // had each one-batch answer sent with its own `send`, and every `send` on a TCP
            // socket runs the stack (on loopback, the receiver's half too). Nothing waits in
            // the buffer: it is flushed before the writer waits for a request or an answer.
            let next = flushed_before_waiting(rx.recv(), &mut writer, socket, &mut broken);
            let Some(task) = next.await else { break };
            let served = flushed_before_waiting(task, &mut writer, socket, &mut broken).await;
            if broken {
                continue;
            }
            if served.close {
                // What was answered before it still goes out.
                let _ = writer.flush().await;
                // SAFETY: shutdown of this connection's socket, which is open; the reader
                // then sees the end and stops taking requests.
                unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
                broken = true;
            } else if let Some(frame) = served.frame {
                probe
                    .bytes_out
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
                if write_frame(&mut writer, socket, zero_copy, &frame)
                    .await
                    .is_err()
                {
                    cut_short(socket);
                    broken = true;
                }
            }
            if let Some((api_key, handled)) = served.handled {
                probe.record_phase(api_key, SEND, handled);
            }
        }
        // Writes out what is gathered, then closes.
        let _ = writer.close().await;
    });
    if let Err(reason) = read_loop(&shard, reader, &tx, &client_host).await {
        tracing::debug!(shard = shard.id, %peer, %reason, "closing connection");
    }
    drop(tx);
    writer_task.await;
    shard.probe.connections_open.fetch_sub(1, Ordering::Relaxed);
}

/// Bytes of answers a connection gathers before it writes them (see `serve`'s writer).
const WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// Writes out what the writer gathered unless the connection is already `broken`; says
/// whether it broke now.
async fn flush(
    writer: &mut futures::io::BufWriter<impl futures::io::AsyncWrite + Unpin>,
    socket: RawFd,
    broken: bool,
) -> bool {
    if broken || writer.buffer().is_empty() || writer.flush().await.is_ok() {
        return false;
    }
    cut_short(socket);
    true
}

/// `fut`'s output. If it is not there at once, what the writer gathered goes out first (see
/// [`flush`]), so no answer waits in the buffer while the writer waits.
async fn flushed_before_waiting<T>(
    fut: impl std::future::Future<Output = T>,
    writer: &mut futures::io::BufWriter<impl futures::io::AsyncWrite + Unpin>,
    socket: RawFd,
    broken: &mut bool,
) -> T {
    let mut fut = std::pin::pin!(fut);
    if let Some(out) = fut.as_mut().now_or_never() {
        return out;
    }
    *broken |= flush(writer, socket, *broken).await;
    fut.await
}

/// A response frame was cut short: nothing more can be sent on this connection. It is shut
/// down both ways, so the client sees it close (and retries elsewhere) and the reader stops
/// taking requests, rather than leaving a half frame on a live connection until the client's
/// timeout.
fn cut_short(socket: RawFd) {
    // SAFETY: shutdown of this connection's socket, which is open.
    unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
}

/// Windows of a response that are made ready (a cold one read from disk) while an earlier one
/// is being written. With one read at a time the disk sat idle while the socket was written,
/// and the socket while the disk was read.
const WINDOWS_AHEAD: usize = 4;

/// A piece of a response as it is written: bytes in memory, a window of a segment mapping to
/// send with `sendfile`, or a window read past the page cache (`kaas_storage::direct`).
enum Piece {
    Copy(Bytes),
    /// With whether its pages were all in the page cache when the window was prepared.
    File(Bytes, bool),
    Read(kaas_storage::direct::DirectRead),
}

/// Writes `frame`: chunks that are slices of a segment mapping (record sets) in windows of
/// `kaas_storage::direct::WINDOW_BYTES`. Under a memory limit the broker is close to
/// (`kaas_storage::memory_limit`), a window whose pages are not all in the page cache is read
/// past it while the windows before it are written ([`WINDOWS_AHEAD`]), so history a consumer
/// catches up on neither waits for the disk one window at a time nor makes every read evict a
/// page first. Otherwise, and when a window cannot be read that way, it is sent with
/// `sendfile` as any other ([`send_file`]), and stays in the page cache for the next reader.
async fn write_frame(
    writer: &mut futures::io::BufWriter<impl futures::io::AsyncWrite + Unpin>,
    socket: RawFd,
    zero_copy: bool,
    frame: &ResponseFrame,
) -> std::io::Result<()> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    const WINDOW: usize = kaas_storage::direct::WINDOW_BYTES;
    if !(zero_copy && frame.chunks.iter().any(sendfile_worth)) {
        // Every answer but a Fetch's: nothing to prepare, so no stream of windows to build
        // (three allocations per answer).
        for chunk in &frame.chunks {
            writer.write_all(chunk).await?;
        }
        return Ok(());
    }
    let pieces = frame.chunks.iter().flat_map(|chunk| {
        let file = zero_copy && sendfile_worth(chunk);
        let windows = if file {
            chunk.len().div_ceil(WINDOW)
        } else {
            1
        };
        (0..windows).map(move |k| {
            if file {
                let window = chunk.slice(k * WINDOW..chunk.len().min((k + 1) * WINDOW));
                Piece::File(window, false)
            } else {
                Piece::Copy(chunk.clone())
            }
        })
    });
    let mut ready = stream::iter(pieces)
        .map(|piece| async move {
            let Piece::File(window, _) = piece else {
                return Ok(piece);
            };
            if kaas_storage::resident::window_in_page_cache(&window) {
                return Ok(Piece::File(window, true));
            }
            match kaas_storage::direct::read(&window).await {
                Some(Ok(read)) => Ok(Piece::Read(read)),
                Some(Err(e)) => Err(segment_unreadable(e)),
                None => Ok(Piece::File(window, false)),
            }
        })
        .buffered(WINDOWS_AHEAD);
    while let Some(piece) = ready.try_next().await? {
        match piece {
            Piece::Copy(bytes) => writer.write_all(&bytes).await?,
            Piece::File(window, cached) => {
                // `sendfile` writes to the socket itself, after what is gathered before it.
                writer.flush().await?;
                send_file(writer.get_mut(), socket, &window, cached).await?
            }
            Piece::Read(read) => writer.write_all(&read).await?,
        }
    }
    Ok(())
}

/// When the socket is full, this much of a file-backed chunk is written through glommio (a
/// copy) to wait for room: glommio has no public wait for write readiness, and its write polls
/// for it. A full socket frees at least a third of its buffer before waking a writer, so the
/// copy is a small fraction of what is sent.
const READINESS_WRITE_BYTES: usize = 4 * 1024;

/// Says (once per 10 s) that a response could not be read from its segment file, the data
/// volume's problem rather than the client's; the caller closes the connection.
fn segment_unreadable(e: std::io::Error) -> std::io::Error {
    crate::ratelog::limited("sendfile-file-error", |suppressed| {
        tracing::warn!(error = %e, suppressed, "a fetch response could not be read from its segment file; closing the connection (check the data volume)");
    });
    e
}

/// Set once `sendfile` failed as unsupported by the data directory's file system.
static SENDFILE_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// Whether `chunk` may go out with `sendfile`: record sets are their own chunks from
/// `ZERO_COPY_MIN_BYTES` up (smaller ones are copied into the response's header bytes), and
/// only those can be slices of a segment mapping.
fn sendfile_worth(chunk: &Bytes) -> bool {
    chunk.len() >= kaas_wire::fetch_frame::ZERO_COPY_MIN_BYTES
        && !SENDFILE_UNSUPPORTED.load(Ordering::Relaxed)
}

/// Sets O_NONBLOCK on the socket; false (and responses are copied) if that fails.
fn set_nonblocking(socket: RawFd) -> bool {
    // SAFETY: fcntl on a descriptor this connection owns, with integer arguments.
    unsafe {
        let flags = libc::fcntl(socket, libc::F_GETFL);
        flags >= 0 && libc::fcntl(socket, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    }
}

/// Sends `window` (at most `kaas_storage::direct::WINDOW_BYTES`, [`write_frame`]) with
/// `sendfile` from the segment file it is a mapped slice of, and copies what cannot go that
/// way: a window that is not such a slice, or the rest of one whose segment let go of its file
/// meanwhile (`kaas_storage::resident::with_file_backing`). `cached` says whether its pages
/// were all in the page cache a moment ago (the caller looked); what a partial send leaves is
/// looked at again.
///
/// What is in the page cache is sent from the shard's thread. What needs the disk is sent
/// from the shard's blocking threads, a bounded number at once
/// (`kaas_storage::resident::off_shard`): `sendfile` reads uncached pages synchronously, and
/// on the shard's thread that read would stall every connection and partition of the shard —
/// a consumer catching up on history would hold up produce acknowledgements — for the disk's
/// latency.
async fn send_file(
    writer: &mut (impl AsyncWriteExt + Unpin),
    socket: RawFd,
    chunk: &Bytes,
    cached: bool,
) -> std::io::Result<()> {
    let mut done = 0;
    let mut first = true;
    while done < chunk.len() {
        let window = chunk.slice(done..);
        // A window found cached when it was prepared is trusted to its end: that look is up
        // to WINDOWS_AHEAD windows old already, and asking again after every partial send (a
        // full socket) was a `mincore` of the rest of the window each time, most of the
        // `mincore` work of a consume. A cold window is looked at again after each send from
        // the blocking thread, whose `sendfile` reads ahead.
        let cold = !cached && (first || !kaas_storage::resident::in_page_cache(&window));
        first = false;
        // The blocking thread gets its own duplicate of the socket: the call runs even if this
        // task is dropped meanwhile (shutdown), and the connection's descriptor number could by
        // then name another connection's socket. With no descriptor to spare (EMFILE), the
        // window is sent from this thread, as every window was before.
        let sent = match cold.then(|| dup_socket(socket)).flatten() {
            Some(dup) => {
                kaas_storage::resident::off_shard(move || sendfile_once(dup.as_raw_fd(), &window))
                    .await
            }
            None => sendfile_once(socket, &window),
        };
        let e = match sent {
            None => return writer.write_all(&chunk[done..]).await,
            Some(Ok(0)) => {
                // The file ends before the slice does: something truncated a segment that this
                // broker was reading (another broker's recovery cutting a deposed leader's
                // tail in cluster mode, or a hand on the volume). The frame cannot be completed.
                return Err(segment_unreadable(std::io::ErrorKind::UnexpectedEof.into()));
            }
            Some(Ok(n)) => {
                done += n;
                continue;
            }
            Some(Err(e)) => e,
        };
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EIO) => return Err(segment_unreadable(e)),
            Some(libc::EAGAIN) => {
                let step = chunk.slice(done..chunk.len().min(done + READINESS_WRITE_BYTES));
                // Copied from the mapping: a page not in the page cache is read in from the
                // blocking thread first, so that the copy does not fault on the shard's.
                if !kaas_storage::resident::in_page_cache(&step) {
                    let cold = step.clone();
                    kaas_storage::resident::off_shard(move || {
                        kaas_storage::resident::read_into_cache(&cold)
                    })
                    .await;
                }
                writer.write_all(&step).await?;
                done += step.len();
            }
            // A file system that cannot splice its pages (sendfile needs `splice_read`): the
            // rest, and every later chunk, is copied from the mapping instead.
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                if !SENDFILE_UNSUPPORTED.swap(true, Ordering::Relaxed) {
                    tracing::info!(error = %e, "sendfile from the data directory is not supported; fetch responses are copied from the segment mappings instead");
                }
                return writer.write_all(&chunk[done..]).await;
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// A duplicate of the connection's socket, owned by the caller; `None` if none can be made.
fn dup_socket(socket: RawFd) -> Option<OwnedFd> {
    // SAFETY: a duplicate (close-on-exec, as Rust opens every descriptor) of this
    // connection's open socket.
    let dup = unsafe { libc::fcntl(socket, libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: a new descriptor that nothing else owns.
    (dup >= 0).then(|| unsafe { OwnedFd::from_raw_fd(dup) })
}

/// One `sendfile` of `window` to `socket`: the bytes sent, or `None` when `window` is not (or
/// no longer) file-backed.
fn sendfile_once(socket: RawFd, window: &Bytes) -> Option<std::io::Result<usize>> {
    kaas_storage::resident::with_file_backing(window, |file, offset| {
        let mut at = offset as libc::off_t;
        // SAFETY: `socket` is open for the call (the caller's); `file` is open while this
        // closure runs (`with_file_backing`); `at` is a valid off_t the call updates.
        let n = unsafe { libc::sendfile(socket, file, &mut at, window.len()) };
        // errno is read here, before the lock is released.
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    })
}

/// A request's outcome, as the writer gets it: the response to send (none for acks=0), whether
/// to close the connection instead, and, for a request that was handled, its API and when
/// handling ended (the send phase starts).
struct Served {
    frame: Option<ResponseFrame>,
    close: bool,
    handled: Option<(i16, Instant)>,
}

impl Served {
    /// A handled request's outcome, handling having ended now.
    fn of(reply: handlers::Reply, api_key: i16) -> Self {
        let (frame, close) = match reply {
            handlers::Reply::Send(frame) => (Some(frame), false),
            handlers::Reply::Silent => (None, false),
            handlers::Reply::Close => (None, true),
        };
        Served {
            frame,
            close,
            handled: Some((api_key, Instant::now())),
        }
    }
}

/// Why a connection is closed by us rather than by the client.
enum Close {
    Eof,
    Io(std::io::Error),
    Protocol(WireError),
    Idle(Duration),
    Slow { len: usize, received: usize },
    Stopping,
}

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Close::Eof => write!(f, "client closed the connection"),
            Close::Io(e) => write!(f, "socket error: {e}"),
            Close::Protocol(e) => write!(f, "protocol error: {e}"),
            Close::Idle(d) => write!(f, "no request for {d:?} (connections.max.idle.ms)"),
            Close::Stopping => write!(f, "the broker is stopping"),
            Close::Slow { len, received } => write!(
                f,
                "request body stopped arriving: {received} of {len} bytes (--request-progress-timeout-ms)"
            ),
        }
    }
}

async fn read_loop<R: futures::io::AsyncRead + Unpin>(
    shard: &Rc<Shard>,
    reader: R,
    tx: &local_channel::LocalSender<Task<Served>>,
    client_host: &Rc<str>,
) -> Result<(), Close> {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    // The gates of the requests dispatched so far (see the module docs). Reading the next
    // frame meanwhile is unobservable; dispatching it is not.
    let mut gates = Gates::default();
    let idle = Duration::from_millis(shard.config.connections_max_idle_ms);
    loop {
        // A stopping broker takes no more requests; those read so far are answered (the
        // writer drains them) before the shard closes its partitions (see `crate::stopping`).
        // A request cut off mid-read was never run: its client sends it again, harmlessly.
        if shard.stopping.is_set() {
            return Err(Close::Stopping);
        }
        let mut prefix = [0u8; FRAME_PREFIX_LEN];
        let read = {
            let read = std::pin::pin!(within(idle, reader.read_exact(&mut prefix)));
            let stopping = std::pin::pin!(shard.stopping.wait());
            match futures::future::select(read, stopping).await {
                futures::future::Either::Left((read, _)) => read,
                futures::future::Either::Right(_) => return Err(Close::Stopping),
            }
        };
        match read {
            None => {
                shard.admission.closed_idle.fetch_add(1, Ordering::Relaxed);
                return Err(Close::Idle(idle));
            }
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(eof_or_io(e)),
        }
        // The length is checked against the limit before a byte of the body is allocated.
        let len = frame_len(prefix, shard.config.max_frame_bytes)
            .map_err(|e| protocol_error(shard, e))?;
        let body = read_body(&Budget::of(shard), &mut reader, len).await?;
        shard
            .probe
            .bytes_in
            .fetch_add((len + FRAME_PREFIX_LEN) as u64, Ordering::Relaxed);
        let received = Instant::now();
        let decoded = decode_request(body.into_bytes());
        let produce = matches!(&decoded, Ok(r) if r.api_key == ApiKey::Produce);
        gates.wait_before(produce).await;
        let task = match decoded {
            Ok(request) => {
                shard
                    .probe
                    .count_request(request.api_key as i16, request.version());
                let shard = shard.clone();
                let client_host = client_host.clone();
                let (gate, effects) = EffectGate::new();
                gates.push(effects);
                glommio::spawn_local(async move {
                    let started = Instant::now();
                    let api_key = request.api_key;
                    shard.probe.record_phase(api_key as i16, QUEUE, received);
                    let reply = handlers::handle(&shard, request, gate, &client_host).await;
                    shard.probe.record_phase(api_key as i16, PROCESS, started);
                    Served::of(reply, api_key as i16)
                })
            }
            // KIP-511: a newer ApiVersions than we know gets our ranges, so the client can
            // retry with a version we speak.
            Err(WireError::UnsupportedVersion {
                api_key: 18,
                correlation_id,
                ..
            }) => {
                let bytes = codec::unsupported_api_versions_response(correlation_id);
                glommio::spawn_local(async move {
                    Served {
                        frame: Some(ResponseFrame::single(bytes)),
                        close: false,
                        handled: None,
                    }
                })
            }
            // Anything else we cannot parse closes the connection, as Kafka does: there is no
            // way to answer a request whose header we could not read.
            Err(e) => return Err(protocol_error(shard, e)),
        };
        if tx.send(task).await.is_err() {
            return Err(Close::Eof);
        }
    }
}

/// The [`Effects`] of a connection's dispatched requests that may still be under way.
#[derive(Default)]
struct Gates {
    /// The last request's: every earlier request's order step has opened before it was
    /// dispatched, so this one alone says whether a Produce may go next.
    last: Option<Effects>,
    /// Those not yet seen done, oldest first. A Produce may be dispatched while its
    /// predecessors' appends are under way, so "the last request is done" does not mean
    /// "every request is"; any other request waits for all of these.
    open: std::collections::VecDeque<Effects>,
}

impl Gates {
    /// Waits until the next request may be dispatched: a Produce once the previous request's
    /// effects are queued in order, anything else once every earlier request's effects are
    /// done. A gate that fired and one that was dropped both count as open.
    async fn wait_before(&mut self, produce: bool) {
        if produce {
            if let Some(last) = self.last.take() {
                last.ordered().await;
            }
            // Forget those already done, so the list holds only requests still under way.
            while self.open.front().is_some_and(Effects::is_done) {
                self.open.pop_front();
            }
        } else {
            self.last = None;
            while let Some(effects) = self.open.pop_front() {
                effects.done().await;
            }
        }
    }

    fn push(&mut self, effects: Effects) {
        self.last = Some(effects.clone());
        self.open.push_back(effects);
    }
}

fn eof_or_io(e: std::io::Error) -> Close {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Close::Eof
    } else {
        Close::Io(e)
    }
}

/// `fut`'s output, or `None` if it took longer than `limit`. No timer is created when `fut`
/// is ready at once (the common case: the bytes are already in the read buffer).
async fn within<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
    let fut = std::pin::pin!(fut);
    let timer = std::pin::pin!(glommio::timer::sleep(limit));
    match futures::future::select(fut, timer).await {
        futures::future::Either::Left((out, _)) => Some(out),
        futures::future::Either::Right(_) => None,
    }
}

/// What reading a request body is held to: the broker-wide request memory budget and the
/// progress timeout.
struct Budget<'a> {
    admission: &'a Arc<Admission>,
    shard: usize,
    progress: Duration,
}

impl<'a> Budget<'a> {
    fn of(shard: &'a Shard) -> Budget<'a> {
        Budget {
            admission: &shard.admission,
            shard: shard.id,
            progress: Duration::from_millis(shard.config.request_progress_timeout_ms),
        }
    }
}

/// Reads a `len`-byte request body: the first [`FIRST_CHUNK_BYTES`] outside the budget, then
/// the rest under one reservation (see [`crate::admission`]), each [`PROGRESS_STEP_BYTES`]
/// within the progress timeout.
async fn read_body<R: futures::io::AsyncRead + Unpin>(
    budget: &Budget<'_>,
    reader: &mut BufReader<R>,
    len: usize,
) -> Result<RequestBody, Close> {
    if reader.buffer().len() >= len {
        // The whole body arrived with an earlier read (a run of small requests, or a 16 KB
        // produce among them): one allocation of its length and one copy, instead of growing
        // a zeroed buffer step by step (a 4 KiB allocation, a reallocation and a memset were
        // 2.9% of a broker's samples under librdkafka's one-batch requests at acks=all). It is
        // at most the read buffer's size, below what the body pool keeps.
        let reservation = if len > FIRST_CHUNK_BYTES {
            Some(reserve(budget, len - FIRST_CHUNK_BYTES).await)
        } else {
            None
        };
        let body = RequestBody(reader.buffer()[..len].to_vec(), reservation);
        reader.consume_unpin(len);
        return Ok(body);
    }
    let mut body = RequestBody::take(len);
    let mut received = 0;
    while received < len {
        if received == FIRST_CHUNK_BYTES {
            body.1 = Some(reserve(budget, len - received).await);
        }
        let step = body_step(received, len);
        if body.0.len() < received + step {
            // Grow by doubling, so resident memory follows what actually arrived.
            body.0
                .resize((received + step).max(received * 2).min(len), 0);
        }
        match within(
            budget.progress,
            read_exact_past_buffer(
                reader,
                &mut body.0[received..received + step],
                len - received,
            ),
        )
        .await
        {
            None => {
                budget.admission.closed_slow.fetch_add(1, Ordering::Relaxed);
                return Err(Close::Slow { len, received });
            }
            Some(Ok(())) => received += step,
            Some(Err(e)) => return Err(eof_or_io(e)),
        }
    }
    body.0.truncate(len);
    debug_assert_eq!(body.0.len(), len);
    debug_assert_eq!(
        body.1.as_ref().map_or(0, Reservation::bytes),
        len.saturating_sub(FIRST_CHUNK_BYTES)
    );
    Ok(body)
}

/// Fills `buf`, the next bytes of a request body that has `body_left` bytes still to come
/// (`buf` included), from what `reader` holds and then, while [`DIRECT_READ_MIN_BYTES`] or
/// more of the body remain, straight from the socket: a produce request's records are not
/// copied through the read buffer (that copy was 2.3% of a produce-bound broker's CPU at
/// acks=1 and 4.9% at acks=all, measured 2026-12-03). The body's last bytes go through the
/// buffer, so one `recv` still gathers them with a run of small requests behind them.
async fn read_exact_past_buffer<R: futures::io::AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    buf: &mut [u8],
    body_left: usize,
) -> std::io::Result<()> {
    debug_assert!(body_left >= buf.len());
    let held = reader.buffer();
    let n = held.len().min(buf.len());
    buf[..n].copy_from_slice(&held[..n]);
    reader.consume_unpin(n);
    let rest = &mut buf[n..];
    if body_left - n >= DIRECT_READ_MIN_BYTES {
        // The buffer is empty now (it held fewer bytes than `buf` wants, or `rest` is empty),
        // so bytes read past it cannot overtake bytes it holds.
        debug_assert!(rest.is_empty() || reader.buffer().is_empty());
        reader.get_mut().read_exact(rest).await
    } else {
        reader.read_exact(rest).await
    }
}

/// How many bytes of a `len`-byte body to read next when `received` have arrived: the rest of
/// the first [`FIRST_CHUNK_BYTES`] (read before any reservation), then up to
/// [`PROGRESS_STEP_BYTES`] at a time.
fn body_step(received: usize, len: usize) -> usize {
    let limit = if received < FIRST_CHUNK_BYTES {
        FIRST_CHUNK_BYTES
    } else {
        len
    };
    (limit.min(len) - received).min(PROGRESS_STEP_BYTES)
}

/// `bytes` of request memory, waiting (without reading the socket, so TCP pushes back on the
/// client) while the broker-wide budget is exhausted.
async fn reserve(budget: &Budget<'_>, bytes: usize) -> Reservation {
    if let Some(r) = budget.admission.try_reserve(bytes) {
        return r;
    }
    budget
        .admission
        .memory_waits
        .fetch_add(1, Ordering::Relaxed);
    crate::ratelog::limited("request-memory", |suppressed| {
        tracing::warn!(
            shard = budget.shard,
            budget = budget.admission.limits().request_bytes,
            suppressed,
            "request memory budget (--queued-max-request-bytes) exhausted: connections wait before reading more; raise it if this persists under normal load"
        )
    });
    let mut pause = Duration::from_millis(1);
    loop {
        glommio::timer::sleep(pause).await;
        if let Some(r) = budget.admission.try_reserve(bytes) {
            return r;
        }
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Request bodies at least this large come from a per-thread pool of buffers (smaller ones
/// are ordinary heap allocations, which glibc already recycles).
const POOLED_BODY_BYTES: usize = 128 * 1024;
/// Most bytes of idle request buffers a thread keeps for reuse.
const BODY_POOL_BYTES: usize = 16 * 1024 * 1024;

thread_local! {
    static BODY_POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A request body's buffer. Large bodies (a produce request is typically 1 MiB) reuse a
/// buffer whose pages are already resident: allocated fresh, each one was a new mapping (the
/// broker keeps glibc's mmap threshold fixed, see `main`), and the kernel faulted in every
/// 4 KiB page while the socket was read into it — about 7% of the machine's CPU at 600,000
/// 1 KiB messages/s. The buffer returns to the pool of whichever thread drops the last
/// reference to the request (produce hands partition data to other shards).
struct RequestBody(Vec<u8>, Option<Reservation>);

impl RequestBody {
    /// An empty body with room for `len` bytes if a pooled buffer has it; it grows as the
    /// bytes arrive.
    fn take(len: usize) -> RequestBody {
        let mut buf = if len >= POOLED_BODY_BYTES {
            BODY_POOL
                .with(|p| {
                    let mut pool = p.borrow_mut();
                    let i = pool.iter().position(|b| b.capacity() >= len)?;
                    Some(pool.swap_remove(i))
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        // A pooled buffer keeps its old bytes up to `len` (each is overwritten by the socket
        // before it is read): zeroing them again would cost a memset per request.
        buf.truncate(len);
        RequestBody(buf, None)
    }

    fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for RequestBody {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl AsMut<[u8]> for RequestBody {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if self.0.capacity() < POOLED_BODY_BYTES {
            return;
        }
        let buf = std::mem::take(&mut self.0);
        // `try_with`: a thread being torn down simply frees the buffer.
        let _ = BODY_POOL.try_with(|p| {
            let mut pool = p.borrow_mut();
            let held: usize = pool.iter().map(|b| b.capacity()).sum();
            if held + buf.capacity() <= BODY_POOL_BYTES {
                pool.push(buf);
            }
        });
    }
}

fn protocol_error(shard: &Shard, e: WireError) -> Close {
    shard.probe.protocol_errors.fetch_add(1, Ordering::Relaxed);
    crate::ratelog::limited(
        "protocol-error",
        |suppressed| tracing::warn!(shard = shard.id, error = %e, suppressed, "refusing request and closing the connection (counted in kaas_protocol_errors_total)"),
    );
    Close::Protocol(e)
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use proptest::prelude::*;

    use super::*;

    /// A socket that hands out at most `chunk` bytes per read.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl futures::io::AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.chunk).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(n))
        }
    }

    proptest! {
        /// Bodies read partly from the read buffer and partly past it arrive whole and in
        /// order, whatever the sizes of the socket's reads and of the bodies — those already
        /// whole in the read buffer (copied at once) and those still arriving (read in steps)
        /// — and each holds exactly its bytes past the first chunk of the memory budget.
        #[test]
        fn bodies_arrive_whole_in_order_and_within_their_reservation(
            bodies in proptest::collection::vec(
                prop_oneof![0usize..20_000, 0usize..200_000],
                1..12,
            ),
            chunk in 1usize..150_000,
        ) {
            let mut data = Vec::new();
            for (i, &len) in bodies.iter().enumerate() {
                data.extend((0..len).map(|j| (i * 31 + j * 7) as u8));
            }
            let expected = data.clone();
            let (got, reserved, left) = glommio::LocalExecutorBuilder::default()
                .spawn(move || async move {
                    let admission = Admission::new(
                        crate::admission::Limits {
                            request_bytes: 1 << 30,
                            connections: 1,
                            connections_per_ip: 1,
                        },
                        crate::disk::DiskSpace::new(&std::env::temp_dir(), Some(0)).unwrap(),
                    );
                    let budget = Budget {
                        admission: &admission,
                        shard: 0,
                        progress: Duration::from_secs(60),
                    };
                    let mut reader =
                        BufReader::with_capacity(READ_BUFFER_BYTES, Trickle { data, at: 0, chunk });
                    let mut got = Vec::new();
                    let mut reserved = Vec::new();
                    for &len in &bodies {
                        let body = match read_body(&budget, &mut reader, len).await {
                            Ok(body) => body,
                            Err(e) => panic!("reading a body of {len} bytes: {e}"),
                        };
                        reserved.push((len, body.1.as_ref().map_or(0, Reservation::bytes)));
                        got.extend_from_slice(body.as_ref());
                    }
                    (got, reserved, admission.reserved())
                })
                .unwrap()
                .join()
                .unwrap();
            prop_assert_eq!(got, expected);
            for (len, bytes) in reserved {
                prop_assert_eq!(bytes, len.saturating_sub(FIRST_CHUNK_BYTES), "body of {}", len);
            }
            prop_assert_eq!(left, 0, "every reservation given back with its body");
        }
    }
}
