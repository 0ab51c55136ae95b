//! Cross-shard calls. This is the one place that knows how work moves between cores: a job is a
//! boxed closure sent over glommio's channel mesh to the shard that owns the data, run there,
//! and its result sent back over a oneshot channel. Keeping glommio's mesh behind this module
//! keeps a runtime change cheap and makes every cross-core hop visible as `shard.on(...)`.

use std::future::Future;
use std::rc::Rc;

use glommio::channels::channel_mesh::{MeshBuilder, Senders};

use crate::shard::Shard;

/// Work sent to another shard. It runs on the receiving shard's executor.
pub type Job = Box<dyn FnOnce(Rc<Shard>) + Send>;

/// Capacity of each shard-to-shard channel; a full channel makes the sender wait (backpressure).
pub const MESH_CHANNEL_CAPACITY: usize = 1024;

pub type Mesh = MeshBuilder<Job, glommio::channels::channel_mesh::Full>;

pub fn new_mesh(shards: usize) -> Mesh {
    MeshBuilder::full(shards, MESH_CHANNEL_CAPACITY)
}

/// The sending half of this shard's place in the mesh.
pub struct Peers {
    senders: Senders<Job>,
}

impl Peers {
    pub fn new(senders: Senders<Job>) -> Self {
        Peers { senders }
    }

    /// Sends `job` to shard `target`. Fails only when the target has shut down.
    pub async fn send(&self, target: usize, job: Job) -> bool {
        self.senders.send_to(target, job).await.is_ok()
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
