//! `abe latency`: the roofline's step times for a model on a GPU, printed, so the figures the
//! README and BENCHMARKS quote (a decode step, a prompt's first token, the KV capacity) come
//! from a command rather than from arithmetic by hand.
//!
//! Everything here is pure arithmetic over [`Roofline::step_ms`] and the continuous core's
//! own [`StepShape::push`], so the times are exactly what the simulator and `abe serve`
//! charge for those steps. Nothing here is on a hot path; it returns text.

use super::Roofline;
use crate::core::continuous::StepShape;
use std::fmt::Write as _;

/// What to print: decode steps of each batch size at one context length, and one prompt
/// prefilled alone in chunks of `prefill_chunk` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Explain {
    /// Context each generating sequence holds when its decode step runs, tokens.
    pub context: u32,
    /// Batch sizes (sequences decoding together) to time.
    pub batches: Vec<u32>,
    /// Prompt length whose first token is timed, tokens.
    pub prompt: u32,
    /// Prefill chunk (`continuous.prefill_chunk`), tokens; at least 1.
    pub prefill_chunk: u32,
}

impl Default for Explain {
    /// The figures the README quotes: 800 tokens of context, batches of 1 and 16, a 750-token
    /// prompt, `abe serve`'s default prefill chunk (512).
    fn default() -> Self {
        Explain {
            context: 800,
            batches: vec![1, 16, 64, 256],
            prompt: 750,
            prefill_chunk: 512,
        }
    }
}

/// Time of one decode step of `batch` sequences, each holding `context` tokens, ms.
pub fn decode_step_ms(r: &Roofline, batch: u32, context: u32) -> f64 {
    let mut s = StepShape::default();
    for _ in 0..batch {
        s.push(context, 1, true);
    }
    r.step_ms(&s)
}

/// Time to a prompt's first token on an otherwise idle replica: its prefill in chunks of
/// `chunk` tokens, one step each, the last of which samples the first token. Returns the
/// steps and the total, ms.
pub fn first_token_ms(r: &Roofline, prompt: u32, chunk: u32) -> (u32, f64) {
    let chunk = chunk.max(1);
    let (mut done, mut steps, mut ms) = (0u32, 0u32, 0.0);
    while done < prompt {
        let n = chunk.min(prompt - done);
        let mut s = StepShape::default();
        s.push(done, n, false);
        ms += r.step_ms(&s);
        done += n;
        steps += 1;
    }
    (steps, ms)
}

/// The text `abe latency` prints.
pub fn render(r: &Roofline, e: &Explain) -> String {
    let mut out = String::new();
    let (l, g) = (r.llm.0, r.gpu.0);
    let _ = writeln!(
        out,
        "roofline: {} on {} x tp {} (flops_efficiency {}, bandwidth_efficiency {})",
        l.name, g.name, r.tp, r.flops_efficiency, r.bandwidth_efficiency
    );
    let _ = writeln!(
        out,
        "KV cache of one replica: {} tokens; max_model_len {}",
        r.kv_capacity_tokens(),
        r.max_model_len()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "decode step, every sequence holding {} tokens of context:",
        e.context
    );
    let _ = writeln!(out, "{:>8}  {:>10}  {:>14}", "batch", "step ms", "tokens/s");
    for &b in &e.batches {
        let ms = decode_step_ms(r, b, e.context);
        let _ = writeln!(
            out,
            "{:>8}  {:>10.2}  {:>14.0}",
            b,
            ms,
            f64::from(b) * 1e3 / ms
        );
    }
    let _ = writeln!(out);
    let (steps, ms) = first_token_ms(r, e.prompt, e.prefill_chunk);
    let _ = writeln!(
        out,
        "first token of a {}-token prompt alone on the replica: {:.2} ms ({} prefill step{} of at \
         most {} tokens; queueing and other sequences' decode not included)",
        e.prompt,
        ms,
        steps,
        if steps == 1 { "" } else { "s" },
        e.prefill_chunk.max(1)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_steps_grow_with_the_batch_and_the_context() {
        let r = Roofline::DEFAULT;
        assert!(decode_step_ms(&r, 16, 800) > decode_step_ms(&r, 1, 800));
        assert!(decode_step_ms(&r, 1, 8_000) > decode_step_ms(&r, 1, 800));
    }

    #[test]
    fn a_prompt_is_prefilled_in_chunks_whose_times_add_up() {
        let r = Roofline::DEFAULT;
        let (steps, ms) = first_token_ms(&r, 750, 512);
        assert_eq!(steps, 2);
        let mut a = StepShape::default();
        a.push(0, 512, false);
        let mut b = StepShape::default();
        b.push(512, 238, false);
        assert!((ms - (r.step_ms(&a) + r.step_ms(&b))).abs() < 1e-12);
        // One chunk big enough for the whole prompt is one step, and never dearer: the same
        // FLOPs, the weights read once.
        let (one, whole) = first_token_ms(&r, 750, 2048);
        assert_eq!(one, 1);
        assert!(whole <= ms + 1e-12, "{whole} > {ms}");
        assert_eq!(first_token_ms(&r, 0, 512), (0, 0.0));
    }

    #[test]
    fn the_report_names_the_pair_and_every_batch() {
        let text = render(&Roofline::DEFAULT, &Explain::default());
        assert!(text.contains("llama-3.1-8b"), "{text}");
        assert!(
            text.contains("KV cache of one replica: 426788 tokens"),
            "{text}"
        );
        for b in [1, 16, 64, 256] {
            assert!(
                text.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{b} "))),
                "{text}"
            );
        }
    }
}
