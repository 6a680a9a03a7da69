//! The intake gate: whether the runtime still takes submissions, and how many submissions
//! are between that check and their push, in one atomic word.
//!
//! The submit/drain handshake (modelled in `loom-tests/tests/drain.rs`):
//! - a submitter [`Gate::enter`]s (one RMW that both counts it in and reads the closed bit),
//!   pushes into its intake rings only if the gate was open, drops its [`Pass`] (leaves),
//!   then rings the engine's doorbell;
//! - `Handle::shutdown` [`Gate::close`]s, then tells the engine to drain;
//! - the draining engine exits only once [`Gate::is_closed_and_empty`] and, checked after
//!   that, every intake ring is empty.
//!
//! Why nothing is left unanswered: every operation on the word is a read-modify-write, so
//! their single modification order decides. A submitter whose enter comes after the close
//! sees the closed bit and refuses. One whose enter comes before it is counted in the word
//! until it leaves, after its push; the engine reads the word after the close (it learnt of
//! the drain from a control message sent after it), so it reads "empty" only once every
//! such submitter has left, and its Acquire load then sees their pushes (each leave is a
//! Release RMW, and every later write to the word is an RMW, which continues its release
//! sequence). No SeqCst, so loom checks this exactly (it does not model SeqCst accesses).
//!
//! Never read the rings before the gate in the engine's exit check, and never push outside
//! a pass.

use super::sync::{AtomicUsize, Ordering};

/// Bit 0 of the word: the gate is closed (draining or stopped).
const CLOSED: usize = 1;
/// One submission inside the gate, counted above the closed bit.
const ONE_INSIDE: usize = 2;

/// The runtime's open/closed state and its count of submissions in progress.
#[derive(Debug)]
pub struct Gate {
    /// `CLOSED` bit | submissions inside x `ONE_INSIDE`. Only ever changed by RMWs.
    word: AtomicUsize,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// An open gate with nobody inside.
    pub fn new() -> Gate {
        Gate {
            word: AtomicUsize::new(0),
        }
    }

    /// Submitter: passes the gate unless it is closed. Push while the returned pass lives,
    /// then drop it; `None` (the gate is closed) means refuse the submission.
    #[inline]
    pub fn enter(&self) -> Option<Pass<'_>> {
        // Relaxed: the modification order of the word alone decides between "counted before
        // the close" and "saw the close" (module docs); the submitter reads nothing else
        // through it.
        let word = self.word.fetch_add(ONE_INSIDE, Ordering::Relaxed);
        let pass = Pass { gate: self };
        if word & CLOSED != 0 {
            // Leaves at once (the drop); the caller still rings the engine, which may be
            // waiting for the gate to empty.
            return None;
        }
        Some(pass)
    }

    /// Closes the gate for good: every later `enter` refuses.
    pub fn close(&self) {
        // An RMW (not a store) so it keeps the release sequences of earlier leaves; the
        // engine learns of the close through the control ring, which orders it after this.
        self.word.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// True until [`Gate::close`].
    pub fn is_open(&self) -> bool {
        self.word.load(Ordering::Relaxed) & CLOSED == 0
    }

    /// Engine, draining: the gate is closed and every submission that entered has left, so
    /// whatever got through is in the rings now (check them after this, never before).
    #[inline]
    pub fn is_closed_and_empty(&self) -> bool {
        // Acquire: pairs with each leave's Release, so their pushes are visible to the ring
        // checks that follow.
        self.word.load(Ordering::Acquire) == CLOSED
    }
}

/// A submission inside the gate; leaves on drop.
#[must_use = "push while the pass lives, then drop it"]
pub struct Pass<'a> {
    gate: &'a Gate,
}

impl Drop for Pass<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: the push made under this pass happens before an engine's Acquire load
        // that reads this count (or a later one) from the word.
        self.gate.word.fetch_sub(ONE_INSIDE, Ordering::Release);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_refuses_and_is_empty_only_when_every_pass_has_left() {
        let gate = Gate::new();
        assert!(gate.is_open());
        let pass = gate.enter().expect("open");
        assert!(!gate.is_closed_and_empty(), "open");
        gate.close();
        assert!(!gate.is_open());
        assert!(!gate.is_closed_and_empty(), "a pass is still inside");
        assert!(gate.enter().is_none(), "closed: refused");
        assert!(
            !gate.is_closed_and_empty(),
            "the first pass is still inside"
        );
        drop(pass);
        assert!(gate.is_closed_and_empty());
    }
}
