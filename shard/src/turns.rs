//! Per-partition append order on the owning shard.
//!
//! A connection may dispatch its next Produce as soon as this one's appends are *queued in
//! order* at their owners, without waiting for them to complete (see `crate::conn`): what keeps
//! the order is this queue. Each append takes its place ([`Turns::take`]) synchronously, at the
//! moment its job reaches the owning shard — jobs sent from one shard arrive in the order they
//! were sent (`crate::mesh`), and a connection's local appends take theirs before the gate
//! opens — and then appends only when every earlier place on the same partition is given back
//! ([`Turn::ready`]). A place is given back when its [`Turn`] is dropped, whether its append ran
//! or the job was abandoned (the shard stopping), so a lost job never stalls the partition.
//!
//! Without this queue a connection had to wait for each append to complete before reading its
//! next request, and with a partition on another shard that was one cross-shard round trip per
//! request with both shards parking in it: 94 µs of broker CPU per librdkafka request against
//! 23 with one shard (bench/README.md).
//!
//! Single-threaded (one per shard), no IO; an idle partition holds no entry.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One partition's queue: places `serving..next` are taken and not yet given back, except
/// those in `left` (given back before their turn came).
#[derive(Default)]
struct Queue {
    next: u64,
    serving: u64,
    left: BTreeSet<u64>,
    waiting: HashMap<u64, Waker>,
}

/// The queues of every partition this shard owns that has an append queued.
pub struct Turns<K> {
    queues: Rc<RefCell<HashMap<K, Queue>>>,
}

impl<K: Hash + Eq + Clone + 'static> Default for Turns<K> {
    fn default() -> Self {
        Turns {
            queues: Rc::new(RefCell::new(HashMap::new())),
        }
    }
}

impl<K: Hash + Eq + Clone + 'static> Turns<K> {
    /// Takes the next place in `key`'s queue. Call it in arrival order; the turn comes after
    /// every place taken before it has been given back.
    pub fn take(&self, key: K) -> Turn<K> {
        let mut queues = self.queues.borrow_mut();
        let q = queues.entry(key.clone()).or_default();
        let place = q.next;
        q.next += 1;
        Turn {
            queues: self.queues.clone(),
            key,
            place,
        }
    }

    /// Partitions with a place taken.
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.queues.borrow().len()
    }
}

/// A place in one partition's queue; dropping it gives the place back.
pub struct Turn<K: Hash + Eq + Clone + 'static> {
    queues: Rc<RefCell<HashMap<K, Queue>>>,
    key: K,
    place: u64,
}

impl<K: Hash + Eq + Clone + 'static> Turn<K> {
    /// Resolves once every earlier place in the queue has been given back.
    pub async fn ready(&self) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await;
    }

    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut queues = self.queues.borrow_mut();
        let q = queues
            .get_mut(&self.key)
            .expect("a queue lives while a place in it is held");
        debug_assert!(q.serving <= self.place, "a place is served once");
        if q.serving == self.place {
            return Poll::Ready(());
        }
        q.waiting.insert(self.place, cx.waker().clone());
        Poll::Pending
    }
}

impl<K: Hash + Eq + Clone + 'static> Drop for Turn<K> {
    fn drop(&mut self) {
        let mut queues = self.queues.borrow_mut();
        let q = queues.get_mut(&self.key).expect("held place");
        q.waiting.remove(&self.place);
        if q.serving != self.place {
            // Given back before its turn (an abandoned job): skipped when the turn reaches it.
            q.left.insert(self.place);
            return;
        }
        q.serving += 1;
        while q.left.remove(&q.serving) {
            q.serving += 1;
        }
        if q.serving == q.next {
            debug_assert!(q.waiting.is_empty() && q.left.is_empty());
            queues.remove(&self.key);
        } else if let Some(waker) = q.waiting.remove(&q.serving) {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use proptest::prelude::*;
    use std::future::Future;

    #[derive(Debug, Clone)]
    enum Step {
        /// Take a place on partition `0`.
        Take(u8),
        /// Poll the `n`-th held place (mod the count); if its turn came, run and drop it.
        Run(usize),
        /// Drop the `n`-th held place without running (an abandoned job).
        Abandon(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3).prop_map(Step::Take),
            any::<usize>().prop_map(Step::Run),
            any::<usize>().prop_map(Step::Abandon),
        ]
    }

    proptest! {
        // Places on a partition run in the order they were taken, one at a time, whatever
        // order they are polled or abandoned in; and once every place is given back, no queue
        // is left behind.
        #[test]
        fn places_run_in_the_order_taken(steps in proptest::collection::vec(step(), 0..200)) {
            let turns: Turns<u8> = Turns::default();
            // (partition, order taken, place)
            let mut held: Vec<(u8, u64, Turn<u8>)> = Vec::new();
            let mut taken = [0u64; 3];
            let mut abandoned: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); 3];
            let mut ran: Vec<Vec<u64>> = vec![Vec::new(); 3];
            for s in steps {
                match s {
                    Step::Take(p) => {
                        held.push((p, taken[p as usize], turns.take(p)));
                        taken[p as usize] += 1;
                    }
                    Step::Run(n) if !held.is_empty() => {
                        let i = n % held.len();
                        let up = held[i].2.ready().now_or_never().is_some();
                        let (p, order, _) = &held[i];
                        // Its turn has come exactly when every earlier place ran or was
                        // abandoned.
                        let earlier_open = held.iter().any(|(q, o, _)| q == p && o < order);
                        prop_assert_eq!(up, !earlier_open);
                        if up {
                            let (p, order, turn) = held.remove(i);
                            ran[p as usize].push(order);
                            drop(turn);
                        }
                    }
                    Step::Abandon(n) if !held.is_empty() => {
                        let (p, order, turn) = held.remove(n % held.len());
                        abandoned[p as usize].insert(order);
                        drop(turn);
                    }
                    _ => {}
                }
            }
            for (p, r) in ran.iter().enumerate() {
                prop_assert!(r.windows(2).all(|w| w[0] < w[1]), "partition {} ran {:?}", p, r);
            }
            held.clear();
            prop_assert_eq!(turns.busy(), 0);
        }
    }

    // A waiting append is woken when the place before it is given back, including when that
    // place was itself skipped over because it was abandoned.
    #[test]
    fn giving_back_wakes_the_next_place() {
        let turns: Turns<u8> = Turns::default();
        let first = turns.take(0);
        let second = turns.take(0);
        let third = turns.take(0);
        let flag = std::sync::Arc::new(Flag(std::sync::Mutex::new(false)));
        let waker = futures::task::waker(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut ready = std::pin::pin!(third.ready());
        assert!(ready.as_mut().poll(&mut cx).is_pending());
        // Abandoned before its turn: nothing moves yet.
        drop(second);
        assert!(!*flag.0.lock().unwrap());
        // The first given back: the second is skipped and the third woken.
        drop(first);
        assert!(*flag.0.lock().unwrap(), "the waiting place was not woken");
        assert!(ready.as_mut().poll(&mut cx).is_ready());
    }

    struct Flag(std::sync::Mutex<bool>);
    impl futures::task::ArcWake for Flag {
        fn wake_by_ref(arc: &std::sync::Arc<Self>) {
            *arc.0.lock().unwrap() = true;
        }
    }
}
