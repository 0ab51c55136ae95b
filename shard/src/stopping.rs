//! The shard's stop signal, for what must end before its partitions close: a clean stop first
//! stops every connection taking requests and lets those it took be answered (`conn`), and
//! ends long polls early (`handlers::fetch`), so that no request the broker read is stored
//! and then left unanswered. A producer without idempotence would send such a request again
//! to the restarted broker, and the records would be stored twice.
//!
//! Runs on the shard's thread only.

use std::cell::RefCell;

use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};

pub struct Stopping {
    /// Dropped on [`Stopping::begin`], which resolves every waiter.
    begin: RefCell<Option<oneshot::Sender<()>>>,
    begun: Shared<oneshot::Receiver<()>>,
}

impl Default for Stopping {
    fn default() -> Self {
        let (tx, rx) = oneshot::channel();
        Stopping {
            begin: RefCell::new(Some(tx)),
            begun: rx.shared(),
        }
    }
}

impl Stopping {
    /// The shard is stopping: wakes every [`Stopping::wait`]. Idempotent.
    pub fn begin(&self) {
        self.begin.borrow_mut().take();
    }

    pub fn is_set(&self) -> bool {
        self.begin.borrow().is_none()
    }

    /// Resolves once [`Stopping::begin`] was called (at once if it was).
    pub fn wait(&self) -> impl std::future::Future<Output = ()> + 'static {
        let begun = self.begun.clone();
        async move {
            // The sender is only ever dropped, never used: Err(Canceled) is the signal.
            let _ = begun.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    #[test]
    fn waiters_wake_on_begin_and_later_ones_at_once() {
        let s = Stopping::default();
        let mut early = Box::pin(s.wait());
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(early.as_mut().poll(&mut cx).is_pending());
        assert!(!s.is_set());
        s.begin();
        assert!(s.is_set());
        assert!(early.as_mut().poll(&mut cx).is_ready());
        assert!(Box::pin(s.wait()).as_mut().poll(&mut cx).is_ready());
        s.begin();
    }
}
