//! How many threads one forward pass runs on: small passes on one, the rest on all cores.
//!
//! candle's CPU kernels (gemm, softmax) and abe's own fused ops split their work over the
//! rayon pool they are called from. Called straight from a worker thread, that is rayon's
//! global pool (one thread per core). A big pass gains from two cores, but a small one
//! loses: the splits of its tiny matrices cost more than the second core gives. So a pass
//! of fewer than [`SINGLE_THREAD_BELOW_TOKENS`] padded tokens runs inside a pool of one
//! thread owned by the worker (every split runs in turn on that thread, and the other core
//! is left to the io and engine threads).
//!
//! Where the line is, with abe's fused encoder (2026-11-24, 21:19-21:27 UTC, the 2-vCPU
//! Xeon with AVX-512, load 1.1-1.9; `cargo bench --profile release --features embed --bench
//! embed_forward -- '16_tokens(_served)?/(1|2|3|4)$'`, criterion medians over three rounds,
//! two threads against one, inputs of 16 tokens): 1 input 5.8-6.2 against 4.4-4.7 ms; 2
//! inputs 7.7-8.4 against 7.1-7.8 ms; 3 inputs 9.5-9.8 against 9.2-9.6 ms; 4 inputs
//! 10.0-11.2 against 11.4-12.3 ms. One thread wins up to 48 padded tokens, two from 64. (The
//! line was 128 with candle's own ops, whose small passes split worse: BENCHMARKS.md, "A
//! real embedding model".)
//!
//! What must never happen here: a pool built per batch (the thread starts once, with the
//! worker's executor), or one pool shared by two workers (each pass would wait on the
//! other's).

/// Passes of fewer padded tokens (inputs x longest) than this run on one thread.
pub const SINGLE_THREAD_BELOW_TOKENS: usize = 64;

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
