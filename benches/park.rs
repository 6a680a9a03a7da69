//! What a hold costs the engine beyond its length: a park and a wake-up on this machine.
//!
//! `park/wake_one_way`: two threads hand a token back and forth with `thread::park` /
//! `Thread::unpark` (what the engine's doorbell does under an arrival); the figure is half a
//! round trip, the latency from an unpark to the parked thread running.
//!
//! `park/timeout_overshoot`: a thread parks with a 200 us timeout (what the engine does for a
//! hold's deadline); the figure is how late it wakes, elapsed minus 200 us.
//!
//! `auto` charges the larger of the two as `HOLD_OVERHEAD_NS` (see
//! `core::strategy::auto`), measured by this bench; BENCHMARKS.md has the run.

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn park(c: &mut Criterion) {
    let mut group = c.benchmark_group("park");
    group.bench_function("wake_one_way", |b| {
        b.iter_custom(|iters| {
            let main = thread::current();
            let ball = Arc::new(AtomicBool::new(false));
            let echo = {
                let ball = Arc::clone(&ball);
                thread::spawn(move || {
                    for _ in 0..iters {
                        // Wait for the serve (true), return it (false).
                        while !ball.load(Ordering::Acquire) {
                            thread::park();
                        }
                        ball.store(false, Ordering::Release);
                        main.unpark();
                    }
                })
            };
            let start = Instant::now();
            for _ in 0..iters {
                ball.store(true, Ordering::Release);
                echo.thread().unpark();
                while ball.load(Ordering::Acquire) {
                    thread::park();
                }
            }
            let elapsed = start.elapsed();
            echo.join().expect("echo thread");
            elapsed / 2
        });
    });
    group.bench_function("timeout_overshoot", |b| {
        const TIMEOUT: Duration = Duration::from_micros(200);
        b.iter_custom(|iters| {
            let mut late = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let deadline = start + TIMEOUT;
                // park_timeout may return early (spurious wake-ups): park until the deadline.
                let mut now = start;
                while now < deadline {
                    thread::park_timeout(deadline - now);
                    now = Instant::now();
                }
                late += now - deadline;
            }
            late
        });
    });
    group.finish();
}

criterion_group!(benches, park);
criterion_main!(benches);
