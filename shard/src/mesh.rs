//! Cross-shard calls. This is the one place that knows how work moves between cores: a job is a
//! boxed closure sent over a bounded channel to the shard that owns the data, run there, and
//! its result sent back over a oneshot channel. Keeping this behind one module keeps a runtime
//! change cheap and makes every cross-core hop visible as `on_shard(...)`.
//!
//! The channels are plain `futures` channels created before any shard starts, so there is no
//! start-up handshake between executors (glommio's `channel_mesh` needs every executor to
//! join before any can proceed, and a join that loses a wake-up stalls start-up). A send from
//! another thread wakes the receiving task through glommio's foreign-wake path (eventfd); the
//! receivers run in a latency-sensitive task queue so a busy shard still picks jobs up promptly.

use std::future::Future;
use std::rc::Rc;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};

use crate::shard::Shard;

/// Work sent to another shard. It runs on the receiving shard's executor.
pub type Job = Box<dyn FnOnce(Rc<Shard>) + Send>;

/// Capacity of each shard's inbox; a full inbox makes senders wait (backpressure).
pub const INBOX_CAPACITY: usize = 1024;

/// One inbox per shard, plus senders to every inbox, made before the shards start.
pub struct Mesh {
    senders: Vec<mpsc::Sender<Job>>,
    inboxes: Vec<Option<mpsc::Receiver<Job>>>,
}

impl Mesh {
    pub fn new(shards: usize) -> Mesh {
        let (senders, inboxes) = (0..shards)
            .map(|_| {
                let (tx, rx) = mpsc::channel(INBOX_CAPACITY);
                (tx, Some(rx))
            })
            .unzip();
        Mesh { senders, inboxes }
    }

    /// Shard `id`'s inbox and senders to every shard. Each inbox is taken once.
    pub fn take(&mut self, id: usize) -> (mpsc::Receiver<Job>, Peers) {
        let inbox = self.inboxes[id]
            .take()
            .expect("each shard takes its inbox once");
        (
            inbox,
            Peers {
                senders: self.senders.clone(),
            },
        )
    }
}

/// The sending half: one sender per shard (including this one, unused).
pub struct Peers {
    senders: Vec<mpsc::Sender<Job>>,
}

impl Peers {
    /// Sends `job` to shard `target`. Fails only when the target has shut down.
    pub async fn send(&self, target: usize, job: Job) -> bool {
        let mut tx = self.senders[target].clone();
        tx.send(job).await.is_ok()
    }
}

/// Runs every job that arrives in this shard's inbox, until all senders are gone.
pub async fn serve_inbox(shard: Rc<Shard>, mut inbox: mpsc::Receiver<Job>) {
    while let Some(job) = inbox.next().await {
        job(shard.clone());
    }
}

/// Runs `f` on shard `target` (directly when that is this shard) and returns its result.
/// Returns `None` when the target shard is gone (shutting down).
pub async fn on_shard<R, F, Fut>(shard: &Rc<Shard>, target: usize, f: F) -> Option<R>
where
    R: Send + 'static,
    F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
    Fut: Future<Output = R> + 'static,
{
    if target == shard.id {
        return Some(f(shard.clone()).await);
    }
    let (tx, rx) = futures::channel::oneshot::channel();
    let job: Job = Box::new(move |remote: Rc<Shard>| {
        glommio::spawn_local(async move {
            let _ = tx.send(f(remote).await);
        })
        .detach();
    });
    if !shard.peers().send(target, job).await {
        return None;
    }
    rx.await.ok()
}
