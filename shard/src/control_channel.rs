//! The control thread's channel into one shard: accepted assignment epochs (as take-overs,
//! relinquishes and revalidations), config changes and group releases.
//!
//! A `crossbeam-channel` queue, as the design asks for the fan-out of epochs: the control
//! thread (tokio) sends without locks or allocation beyond the message, and the shard drains
//! the queue on its own executor. A glommio task cannot block on a crossbeam receiver, so the
//! shard's task parks on an [`AtomicWaker`] that every send wakes (glommio's foreign-thread
//! wake, an eventfd write); the task runs in a latency-sensitive queue (see `lib.rs`), so a
//! shard busy with produce traffic still picks the message up within its preemption quantum.
//!
//! The receiving task lives as long as the shard, so a wake from the control thread never
//! races the task's completion (the glommio hazard `mesh.rs` describes) except at shutdown,
//! when the control thread has stopped sending.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use futures::task::AtomicWaker;

use crate::cluster::ControlMsg;

/// The control thread's end.
#[derive(Clone)]
pub struct ControlSender {
    tx: Sender<(Instant, ControlMsg)>,
    wake: Arc<AtomicWaker>,
}

/// The shard's end.
pub struct ControlReceiver {
    rx: Receiver<(Instant, ControlMsg)>,
    wake: Arc<AtomicWaker>,
}

/// A channel from the control thread to one shard.
pub fn control_channel() -> (ControlSender, ControlReceiver) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(AtomicWaker::new());
    (
        ControlSender {
            tx,
            wake: wake.clone(),
        },
        ControlReceiver { rx, wake },
    )
}

impl ControlSender {
    /// Queues `msg` and wakes the shard. Gives the message back if the shard has stopped (its
    /// oneshot senders are then dropped on this thread, which fails the waits on them).
    pub fn send(&self, msg: ControlMsg) -> Result<(), ControlMsg> {
        self.tx
            .send((Instant::now(), msg))
            .map_err(|e| e.into_inner().1)?;
        self.wake.wake();
        Ok(())
    }
}

impl Drop for ControlSender {
    fn drop(&mut self) {
        // The last sender gone: let the shard see the disconnection.
        self.wake.wake();
    }
}

impl ControlReceiver {
    /// The next message and how long it waited in the queue; `None` once every sender is gone.
    pub async fn recv(&self) -> Option<(ControlMsg, Duration)> {
        futures::future::poll_fn(|cx| {
            let take = |r: Result<(Instant, ControlMsg), TryRecvError>| match r {
                Ok((sent, msg)) => Some(Poll::Ready(Some((msg, sent.elapsed())))),
                Err(TryRecvError::Disconnected) => Some(Poll::Ready(None)),
                Err(TryRecvError::Empty) => None,
            };
            if let Some(ready) = take(self.rx.try_recv()) {
                return ready;
            }
            self.wake.register(cx.waker());
            // A send between the first look and the registration woke nobody: look again.
            take(self.rx.try_recv()).unwrap_or(Poll::Pending)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A message sent from another thread wakes the shard's task and arrives in order; the
    // channel reports the end once the senders are gone.
    #[test]
    fn messages_from_another_thread_arrive_in_order_and_then_the_end() {
        let (tx, rx) = control_channel();
        let sender = std::thread::spawn(move || {
            for _ in 0..100 {
                assert!(
                    tx.send(ControlMsg::ConfigsChanged).is_ok(),
                    "receiver alive"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        let got = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let mut n = 0;
                while let Some((msg, _waited)) = rx.recv().await {
                    assert!(matches!(msg, ControlMsg::ConfigsChanged));
                    n += 1;
                }
                n
            })
            .expect("executor starts")
            .join()
            .expect("executor ran");
        sender.join().unwrap();
        assert_eq!(got, 100);
    }
}
