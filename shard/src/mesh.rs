//! Cross-shard calls. This is the one place that knows how work moves between cores: a job is a
//! boxed closure sent over a bounded channel to the shard that owns the data, run there, and
//! its result sent back as another job that completes a oneshot on the requester's thread. Keeping this behind one module keeps a runtime
//! change cheap and makes every cross-core hop visible as `on_shard(...)` (or `dispatch(...)`,
//! its first half, for a caller that must know the job's place in the target's order).
//!
//! The channels are plain `futures` channels created before any shard starts, so there is no
//! start-up handshake between executors (glommio's `channel_mesh` needs every executor to
//! join before any can proceed, and a join that loses a wake-up stalls start-up). A send from
//! another thread wakes the receiving task through glommio's foreign-wake path (eventfd); the
//! receivers run in a latency-sensitive task queue so a busy shard still picks jobs up promptly.

use std::future::Future;
use std::rc::Rc;

use futures::channel::mpsc;
use futures::StreamExt;

/// Work sent to another shard. It runs on the receiving shard's executor, given that shard's
/// context (`C` = `crate::shard::Shard` in the broker; tests use a small one of their own).
/// The mesh knows nothing else of the shard, so it depends on no other module of this crate.
pub type Job<C> = Box<dyn FnOnce(Rc<C>) + Send>;

/// What a shard's context offers the mesh: its own index and senders to every shard.
pub trait Endpoint: Sized + 'static {
    fn shard_id(&self) -> usize;
    fn peers(&self) -> &Peers<Self>;
}

/// Capacity of each shard's inbox; a full inbox makes senders wait (backpressure).
pub const INBOX_CAPACITY: usize = 1024;

/// One inbox per shard, plus senders to every inbox, made before the shards start.
pub struct Mesh<C> {
    senders: Vec<mpsc::Sender<Job<C>>>,
    inboxes: Vec<Option<mpsc::Receiver<Job<C>>>>,
}

impl<C> Mesh<C> {
    pub fn new(shards: usize) -> Mesh<C> {
        let (senders, inboxes) = (0..shards)
            .map(|_| {
                let (tx, rx) = mpsc::channel(INBOX_CAPACITY);
                (tx, Some(rx))
            })
            .unzip();
        Mesh { senders, inboxes }
    }

    /// Shard `id`'s inbox and senders to every shard. Each inbox is taken once.
    pub fn take(&mut self, id: usize) -> (mpsc::Receiver<Job<C>>, Peers<C>) {
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
pub struct Peers<C> {
    senders: Vec<mpsc::Sender<Job<C>>>,
}

impl<C> Peers<C> {
    /// Sends `job` to shard `target`, or gives it back when the target has shut down (so the
    /// caller decides on which thread it is dropped).
    pub async fn send_or_return(&self, target: usize, job: Job<C>) -> Result<(), Job<C>> {
        let mut tx = self.senders[target].clone();
        if futures::future::poll_fn(|cx| tx.poll_ready(cx))
            .await
            .is_err()
        {
            return Err(job);
        }
        // Ready means a slot is reserved for this sender; it fails only if the receiver went
        // away in between, and then the job is dropped here (shutdown).
        let _ = tx.start_send(job);
        Ok(())
    }
}

/// Runs every job that arrives in this shard's inbox, until all senders are gone.
pub async fn serve_inbox<C>(shard: Rc<C>, mut inbox: mpsc::Receiver<Job<C>>) {
    while let Some(job) = inbox.next().await {
        job(shard.clone());
    }
}

/// Runs `f` on shard `target` (directly when that is this shard) and returns its result.
/// Returns `None` when the target shard is gone (shutting down).
///
/// The result comes back as a job in *this* shard's inbox, which completes a oneshot here: a
/// glommio task's waker must never be woken or dropped on another thread. glommio 0.9 frees a
/// completed task when its handle is dropped while a foreign thread is still inside
/// `drop_waker` for it (the last reference dropped abroad re-queues the task through its
/// header) — AddressSanitizer caught exactly that under franz-go's suite (heap-use-after-free
/// in `RawTask::drop_waker`, the "malloc_consolidate(): unaligned fastbin chunk" abort seen in
/// production). So the oneshot's sender is used and dropped only on the requester's thread; the
/// other thread only ever wakes the long-lived inbox task, which never completes while shards
/// run.
pub async fn on_shard<C, R, F, Fut>(shard: &Rc<C>, target: usize, f: F) -> Option<R>
where
    C: Endpoint,
    R: Send + 'static,
    F: FnOnce(Rc<C>) -> Fut + Send + 'static,
    Fut: Future<Output = R> + 'static,
{
    dispatch(shard, target, f).await?.get().await
}

/// A call [`dispatch`]ed: begun on this shard, or queued on another, its result still to come.
pub enum Reply<R, Fut> {
    Here(Fut),
    Away(futures::channel::oneshot::Receiver<R>),
}

impl<R, Fut: Future<Output = R>> Reply<R, Fut> {
    /// The call's result; `None` when the target shard stopped before answering.
    pub async fn get(self) -> Option<R> {
        match self {
            Reply::Here(fut) => Some(fut.await),
            Reply::Away(rx) => rx.await.ok(),
        }
    }
}

/// Starts `f` on shard `target` and returns once its place in that shard's order is fixed: on
/// this shard `f` has been called; on another the job is in the target's inbox, and `f` will be
/// called there, synchronously as the job is taken out, after every job this shard sent to it
/// before. What `f` does before its future first awaits is therefore done in the order this
/// shard dispatched (the per-partition append order relies on it, see `crate::turns`). `None`
/// when the target shard is gone (shutting down). See [`on_shard`] for how the reply travels.
pub async fn dispatch<C, R, F, Fut>(shard: &Rc<C>, target: usize, f: F) -> Option<Reply<R, Fut>>
where
    C: Endpoint,
    R: Send + 'static,
    F: FnOnce(Rc<C>) -> Fut + Send + 'static,
    Fut: Future<Output = R> + 'static,
{
    if target == shard.shard_id() {
        return Some(Reply::Here(f(shard.clone())));
    }
    let home = shard.shard_id();
    let (tx, rx) = futures::channel::oneshot::channel();
    let job: Job<C> = Box::new(move |remote: Rc<C>| {
        let call = f(remote.clone());
        glommio::spawn_local(async move {
            let result = call.await;
            let reply: Job<C> = Box::new(move |_home: Rc<C>| {
                let _ = tx.send(result);
            });
            if let Err(reply) = remote.peers().send_or_return(home, reply).await {
                // The requesting shard is gone (shutdown): dropping the reply here would drop
                // its oneshot sender, and with it a waker of that shard's task, on this thread.
                std::mem::forget(reply);
            }
        })
        .detach();
    });
    if let Err(job) = shard.peers().send_or_return(target, job).await {
        // Never sent: the job (and the oneshot sender in it) is dropped on its own thread.
        drop(job);
        return None;
    }
    Some(Reply::Away(rx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    use std::thread::ThreadId;

    struct Ctx {
        id: usize,
        peers: Peers<Ctx>,
    }

    impl Endpoint for Ctx {
        fn shard_id(&self) -> usize {
            self.id
        }
        fn peers(&self) -> &Peers<Ctx> {
            &self.peers
        }
    }

    /// A waker that records the thread of every clone, wake and drop.
    #[derive(Default)]
    struct Record {
        threads: Mutex<Vec<(&'static str, ThreadId)>>,
    }

    fn note(data: *const (), what: &'static str) {
        // SAFETY: `data` is the `Arc<Record>` leaked by `recording_waker` or a clone of it.
        let record = unsafe { &*(data as *const Record) };
        record
            .threads
            .lock()
            .unwrap()
            .push((what, std::thread::current().id()));
    }

    static VTABLE: RawWakerVTable = RawWakerVTable::new(
        |data| {
            note(data, "clone");
            // SAFETY: one more strong count for the new waker.
            unsafe { Arc::increment_strong_count(data as *const Record) };
            RawWaker::new(data, &VTABLE)
        },
        |data| {
            note(data, "wake");
            // SAFETY: `wake` consumes the waker's count.
            unsafe { Arc::decrement_strong_count(data as *const Record) };
        },
        |data| note(data, "wake_by_ref"),
        |data| {
            note(data, "drop");
            // SAFETY: the waker's count.
            unsafe { Arc::decrement_strong_count(data as *const Record) };
        },
    );

    fn recording_waker(record: &Arc<Record>) -> Waker {
        let data = Arc::into_raw(record.clone()) as *const ();
        // SAFETY: VTABLE's functions keep the Arc count in step with the wakers.
        unsafe { Waker::from_raw(RawWaker::new(data, &VTABLE)) }
    }

    /// Runs `body` on shard 0's executor, given its context, while shard 1's executor serves
    /// its inbox, and returns what `body` returns.
    fn with_two_shards<T, F, Fut>(body: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Rc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let mut mesh: Mesh<Ctx> = Mesh::new(2);
        let (inbox1, peers1) = mesh.take(1);
        let (inbox0, peers0) = mesh.take(0);
        let remote = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let ctx = Rc::new(Ctx {
                    id: 1,
                    peers: peers1,
                });
                serve_inbox(ctx, inbox1).await;
            })
            .unwrap();
        let caller = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let ctx = Rc::new(Ctx {
                    id: 0,
                    peers: peers0,
                });
                glommio::spawn_local(serve_inbox(ctx.clone(), inbox0)).detach();
                body(ctx).await
            })
            .unwrap();
        let out = caller.join().unwrap();
        // The remote shard's inbox stays open (its own context holds a sender to it): it is
        // left running, as shards are until the process ends.
        drop(remote);
        out
    }

    // `dispatch` fixes each job's place when it returns: `f` has run here already for this
    // shard, and on the other shard the `f`s run in the order they were dispatched, however
    // long each job's future then takes (the per-partition append order rests on this).
    #[test]
    fn dispatched_jobs_start_in_dispatch_order() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let seen = started.clone();
        with_two_shards(move |ctx: Rc<Ctx>| async move {
            let mut replies = Vec::new();
            for i in 0..300u32 {
                let target = usize::from(i % 3 != 0);
                let log = seen.clone();
                let reply = dispatch(&ctx, target, move |c: Rc<Ctx>| {
                    log.lock().unwrap().push((c.id, i));
                    async move {
                        let pause = u64::from((i * 7) % 5) * 100;
                        glommio::timer::sleep(std::time::Duration::from_micros(pause)).await;
                        i
                    }
                })
                .await
                .expect("both shards run");
                if target == 0 {
                    // The last job started here (the other shard may have started one of its
                    // own since, on its thread).
                    let last_here = seen
                        .lock()
                        .unwrap()
                        .iter()
                        .rev()
                        .find(|(id, _)| *id == 0)
                        .copied();
                    assert_eq!(last_here, Some((0, i)));
                }
                replies.push(reply);
            }
            let mut got = Vec::new();
            for reply in replies {
                got.push(reply.get().await.expect("answered"));
            }
            assert_eq!(got, (0..300).collect::<Vec<_>>());
        });
        let started = started.lock().unwrap();
        let on_remote: Vec<u32> = started
            .iter()
            .filter(|(s, _)| *s == 1)
            .map(|p| p.1)
            .collect();
        let sent: Vec<u32> = (0..300).filter(|i| i % 3 != 0).collect();
        assert_eq!(on_remote, sent, "jobs started out of dispatch order");
    }

    // A cross-shard call touches the caller's waker only on the caller's thread: glommio 0.9
    // frees a finished task while another thread is inside drop_waker for it (the
    // use-after-free AddressSanitizer found under franz-go's suite), so the reply must not wake
    // or drop the caller's waker abroad. The first version of on_shard did both.
    #[test]
    fn replies_touch_the_callers_waker_only_on_its_thread() {
        let record = Arc::new(Record::default());
        let caller_record = record.clone();
        let caller_thread = with_two_shards(move |ctx: Rc<Ctx>| async move {
            let me = std::thread::current().id();
            for round in 0..200u32 {
                let mut call = Box::pin(on_shard(&ctx, 1, move |_remote: Rc<Ctx>| async move {
                    round * 2
                }));
                let waker = recording_waker(&caller_record);
                let mut cx = Context::from_waker(&waker);
                let got = loop {
                    if let Poll::Ready(v) = call.as_mut().poll(&mut cx) {
                        break v;
                    }
                    glommio::timer::sleep(std::time::Duration::from_micros(50)).await;
                };
                assert_eq!(got, Some(round * 2));
                drop(call);
                drop(waker);
            }
            me
        });
        let foreign: Vec<_> = record
            .threads
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, t)| *t != caller_thread)
            .map(|(what, _)| *what)
            .collect();
        assert!(
            foreign.is_empty(),
            "the caller's waker was touched on another thread: {foreign:?}"
        );
    }
}
