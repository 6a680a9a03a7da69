//! A small value many threads read on their hot path and a rare writer replaces, with no
//! lock on the read side: a sequence lock over atomic words ([`SeqCell`]). The io threads
//! read the injected-fault settings (`api::faults`) this way once per request.
//!
//! The protocol (Boehm, "Can seqlocks get along with programming language memory
//! models?", 2012): the writer makes `seq` odd, stores the words, then makes it even again;
//! a reader loads `seq`, the words, then `seq` again, and keeps the words only when both
//! loads saw the same even number. Every word is an atomic, so a racing read is a retry,
//! never undefined behaviour. Writers are serialised by a mutex (they are rare: an admin
//! call); a reader never takes it. `loom-tests/tests/seq_cell.rs` checks the real code: a
//! read that succeeds returns one whole value, the old or the new, never a mix. Dropping
//! either fence (the writer's release, the reader's acquire) makes the model find a torn
//! read.
//!
//! What must never happen here: a reader that blocks or allocates, or a value returned
//! that no writer wrote.

use super::sync::{fence, AtomicU64, Mutex, Ordering};

/// `N` words, read whole without a lock (see the module doc).
#[derive(Debug)]
pub struct SeqCell<const N: usize> {
    /// Twice the writes finished, plus one while a write is under way.
    seq: AtomicU64,
    /// The value. A reader trusts them only between two equal even loads of `seq`.
    words: [AtomicU64; N],
    /// Serialises writers.
    writer: Mutex<()>,
}

impl<const N: usize> SeqCell<N> {
    /// A cell holding `value`.
    pub fn new(value: [u64; N]) -> SeqCell<N> {
        SeqCell {
            seq: AtomicU64::new(0),
            words: value.map(AtomicU64::new),
            writer: Mutex::new(()),
        }
    }

    /// The value, or `None` when a write raced this read (nothing was torn: try again).
    #[inline]
    pub fn try_read(&self) -> Option<[u64; N]> {
        // Acquire: the words loaded below are at least those of the write that ended
        // at `before`.
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let mut out = [0u64; N];
        for (o, w) in out.iter_mut().zip(&self.words) {
            // Relaxed: ordered by the fences on both sides.
            *o = w.load(Ordering::Relaxed);
        }
        // Acquire fence: a word stored by a later write was loaded above only if that
        // write's odd `seq` (stored before its words, behind a release fence) is visible to
        // the load below, which then differs from `before`.
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == before).then_some(out)
    }

    /// The value (retries while a write is under way; writes are rare and short).
    #[inline]
    pub fn read(&self) -> [u64; N] {
        loop {
            if let Some(v) = self.try_read() {
                return v;
            }
            std::hint::spin_loop();
        }
    }

    /// Replaces the value. Readers never wait for it; another writer does.
    pub fn write(&self, value: [u64; N]) {
        let _only_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let seq = self.seq.load(Ordering::Relaxed);
        debug_assert!(seq & 1 == 0, "writers are serialised");
        // Relaxed store, then a release fence: the odd `seq` is ordered before every word
        // stored below, so a reader that loads one of them sees `seq` moved on.
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(value) {
            w.store(v, Ordering::Relaxed);
        }
        // Release: a reader that loads this even `seq` sees every word above.
        self.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn reads_see_the_last_write_whole() {
        let cell = SeqCell::new([1, 2, 3]);
        assert_eq!(cell.read(), [1, 2, 3]);
        cell.write([4, 5, 6]);
        assert_eq!(cell.try_read(), Some([4, 5, 6]));
    }

    #[test]
    fn concurrent_reads_never_see_a_mix() {
        let cell = std::sync::Arc::new(SeqCell::new([0u64; 4]));
        let writer = {
            let cell = cell.clone();
            std::thread::spawn(move || {
                for i in 1..=20_000u64 {
                    cell.write([i; 4]);
                }
            })
        };
        let mut last = 0;
        while last < 20_000 {
            let v = cell.read();
            assert!(v.iter().all(|&w| w == v[0]), "torn: {v:?}");
            assert!(v[0] >= last, "went back: {} after {last}", v[0]);
            last = v[0];
        }
        writer.join().unwrap();
    }
}
