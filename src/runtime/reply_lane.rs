//! A submitter's reply lane: final answers that workers send straight to the submitter
//! (direct replies, `runtime::direct_reply`), beside the completion ring the engine fills.
//!
//! Many producers (every worker thread), one consumer (the submitter's thread). Bounded at
//! the submitter's in-flight limit, so a push never finds it full: each tagged request gets
//! exactly one final answer, through the engine's ring or through this lane, never both
//! (the batch claim decides), and the submitter has at most that many requests out.
//!
//! The producer's order is: push, then [`ReplyLane::wake`] (the submitter's wake, which
//! goes through its `SleepFlag`: a wake-up is never lost as long as the submitter's re-check
//! before it sleeps looks at this lane too; `Submitter::has_completions` does).
//! `loom-tests/tests/direct_reply.rs` checks that handshake with the claim.
//!
//! Under loom the queue is a mutex-guarded deque: crossbeam's `ArrayQueue` is linearizable
//! but invisible to loom; the model checks the protocol around the queue, not the queue.
//! Nothing here may block in the live build or allocate after [`ReplyLane::new`].

use std::sync::Arc;

/// The queue behind a lane: lock-free in the live build.
#[cfg(not(feature = "loom"))]
type Queue<T> = crossbeam_queue::ArrayQueue<T>;

/// Loom stand-in for `ArrayQueue`: the same bounded, linearizable push/pop.
#[cfg(feature = "loom")]
struct Queue<T> {
    items: super::sync::Mutex<std::collections::VecDeque<T>>,
    capacity: usize,
}

#[cfg(feature = "loom")]
impl<T> Queue<T> {
    fn new(capacity: usize) -> Queue<T> {
        Queue {
            items: super::sync::Mutex::new(std::collections::VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    fn push(&self, event: T) -> Result<(), T> {
        let mut items = self.items.lock().unwrap();
        if items.len() == self.capacity {
            return Err(event);
        }
        items.push_back(event);
        Ok(())
    }

    fn pop(&self) -> Option<T> {
        self.items.lock().unwrap().pop_front()
    }

    fn is_empty(&self) -> bool {
        self.items.lock().unwrap().is_empty()
    }

    fn len(&self) -> usize {
        self.items.lock().unwrap().len()
    }
}

/// Wakes the submitter's thread (a mio `Waker` behind a `SleepFlag`, as the engine's own
/// wake); `None` for a submitter that polls.
pub type Wake = Option<Arc<dyn Fn() + Send + Sync>>;

/// Final answers from workers to one submitter (`T`: `messages::TaggedEvent`).
pub struct ReplyLane<T> {
    queue: Queue<T>,
    wake: Wake,
}

impl<T> std::fmt::Debug for ReplyLane<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyLane").finish_non_exhaustive()
    }
}

impl<T> ReplyLane<T> {
    /// A lane for a submitter with at most `capacity` tagged requests out.
    pub fn new(capacity: usize, wake: Wake) -> ReplyLane<T> {
        ReplyLane {
            queue: Queue::new(capacity.max(1)),
            wake,
        }
    }

    /// Producer (a worker): hands `event` to the submitter. Call [`ReplyLane::wake`] after
    /// the batch's answers are in.
    ///
    /// # Panics
    ///
    /// When the lane is full: the submitter had more requests out than its limit, or a
    /// request was answered twice. Either breaks the runtime's invariants.
    pub fn push(&self, event: T) {
        if self.queue.push(event).is_err() {
            unreachable!("reply lane full: a submitter's request answered twice");
        }
    }

    /// Producer: wakes the submitter if it sleeps (after one or more pushes).
    pub fn wake(&self) {
        if let Some(w) = &self.wake {
            w();
        }
    }

    /// Consumer: hands every answer waiting to `f`; how many. Pops only what `len` counted
    /// (the consumer is the only one popping, so they are there), never a failing pop: on
    /// an empty lane that costs a fence, and the io thread drains once per loop turn.
    pub fn drain(&self, mut f: impl FnMut(T)) -> usize {
        // The common case, nothing there, in two loads (`len` takes three and a loop).
        if self.queue.is_empty() {
            return 0;
        }
        let n = self.queue.len();
        for _ in 0..n {
            match self.queue.pop() {
                Some(c) => f(c),
                None => unreachable!("a reply lane has one consumer: counted answers stay"),
            }
        }
        n
    }

    /// Consumer: nothing waiting (the re-check before sleeping).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
