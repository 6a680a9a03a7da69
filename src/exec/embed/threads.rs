//! How many threads one forward pass runs on: small passes on one, the rest on all cores.
//!
//! candle's CPU kernels (gemm, softmax) split their work over the rayon pool they are
//! called from. Called straight from a worker thread, that is rayon's global pool (one
//! thread per core). With gemm's AVX-512 kernels (Cargo.toml, `gemm` x86-v4) a big pass
//! gains from two cores (batch 8 of 16 tokens: 25-27 ms against 32-34 ms on one; batch 64:
//! 142 ms against 213-227 ms), but a small one loses: gemm splits its tiny matrices across
//! both, and one 16-token input takes 14.4-14.7 ms against 9.8-10.2 ms on one thread; at
//! 2 x 16 tokens one thread still wins (13.4-13.6 ms against 13.7-16.9 ms), at 4 x 16 the
//! two are level (20.0-20.6 against 18.4-25.8 ms). So a pass of fewer than
//! [`SINGLE_THREAD_BELOW_TOKENS`] padded tokens runs inside a pool of one thread owned by
//! the worker (every split runs in turn on that thread, and the other core is left to the
//! io and engine threads). Measured 2026-11-24 on the 2-vCPU box (Xeon with AVX-512), load
//! 1.1-3.3, with `cargo bench --profile release --features embed --bench embed_forward`
//! and `RAYON_NUM_THREADS=1|2`: BENCHMARKS.md, "A real embedding model".
//!
//! What must never happen here: a pool built per batch (the thread starts once, with the
//! worker's executor), or one pool shared by two workers (each pass would wait on the
//! other's).

/// Passes of fewer padded tokens (inputs x longest) than this run on one thread.
pub const SINGLE_THREAD_BELOW_TOKENS: usize = 128;

/// Where one worker's forward passes run.
pub struct ComputeThreads {
    /// One thread, for passes below [`SINGLE_THREAD_BELOW_TOKENS`].
    single: rayon::ThreadPool,
}

impl ComputeThreads {
    /// Starts the worker's single-thread pool, its thread named `name`.
    pub fn new(name: &str) -> Result<ComputeThreads, String> {
        let name = name.to_string();
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(move |_| name.clone())
            .build()
            .map_err(|e| format!("cannot start a compute thread: {e}"))?;
        Ok(ComputeThreads { single })
    }

    /// Runs `f`, a forward pass over `padded_tokens` positions, on one thread if it is
    /// small, else on the calling thread with rayon's global pool; waits for it.
    pub fn run<R: Send>(&self, padded_tokens: usize, f: impl FnOnce() -> R + Send) -> R {
        if padded_tokens < SINGLE_THREAD_BELOW_TOKENS {
            self.single.install(f)
        } else {
            f()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_passes_run_on_the_single_thread_and_big_ones_on_the_caller() {
        let t = ComputeThreads::new("abe-embed-test").unwrap();
        let here = || {
            (
                rayon::current_num_threads(),
                std::thread::current().name().map(str::to_string),
            )
        };
        let (threads, name) = t.run(SINGLE_THREAD_BELOW_TOKENS - 1, here);
        assert_eq!(threads, 1);
        assert_eq!(name.as_deref(), Some("abe-embed-test"));
        let caller = std::thread::current().name().map(str::to_string);
        let (_, name) = t.run(SINGLE_THREAD_BELOW_TOKENS, here);
        assert_eq!(name, caller);
    }
}
