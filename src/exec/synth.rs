//! Deterministic synthetic output: readable text from a fixed vocabulary and unit-norm
//! embeddings, both a pure function of the input text and the client's seed.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The synthetic vocabulary: common English words, so output reads as text.
const VOCAB: &[&str] = &[
    "the", "model", "batch", "token", "request", "latency", "queue", "engine", "fast", "small",
    "large", "data", "worker", "answer", "system", "time", "first", "next", "with", "and", "for",
    "from", "into", "over", "under", "every", "each", "some", "many", "few", "light", "water",
    "river", "stone", "cloud", "garden", "road", "city", "north", "south", "quiet", "bright",
    "early", "late", "simple", "clear", "steady", "open", "close", "round",
];

/// FNV-1a hash of `text`, mixed with `seed`: the stream key for synthetic output.
pub fn stream_key(text: &str, seed: Option<u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ seed.unwrap_or(0).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The next word of a synthetic stream (the stream is `SmallRng::seed_from_u64(key)`).
pub fn word(rng: &mut SmallRng) -> &'static str {
    VOCAB[rng.gen_range(0..VOCAB.len())]
}

/// `tokens` words of synthetic text, one word per token, separated by spaces: the same
/// words, in order, as drawing [`word`] `tokens` times from the stream `key`.
pub fn text(key: u64, tokens: u32) -> String {
    let mut rng = SmallRng::seed_from_u64(key);
    let mut out = String::with_capacity(tokens as usize * 7);
    for i in 0..tokens {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word(&mut rng));
    }
    out
}

/// A unit-norm embedding of `dimensions` values.
pub fn embedding(key: u64, dimensions: usize) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(key);
    let mut v: Vec<f32> = (0..dimensions.max(1))
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x /= norm;
        }
    } else {
        v[0] = 1.0;
    }
    v
}

/// Splits generated text into the pieces streamed as tokens: each word with the space
/// before it (the synthetic model emits one word per token), so the pieces concatenate back
/// to the text exactly.
pub fn token_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let start = usize::from(rest.starts_with(' '));
        let end = rest[start..]
            .find(' ')
            .map(|i| i + start)
            .unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_pieces_concatenate_back_to_the_text() {
        let pieces: Vec<&str> = token_pieces("the quick fox").collect();
        assert_eq!(pieces, vec!["the", " quick", " fox"]);
        assert_eq!(pieces.concat(), "the quick fox");
        assert_eq!(token_pieces("").count(), 0);
    }

    #[test]
    fn text_is_deterministic_has_one_word_per_token_and_seed_changes_it() {
        let k = stream_key("hello", None);
        assert_eq!(text(k, 12), text(k, 12));
        assert_eq!(text(k, 12).split(' ').count(), 12);
        assert_ne!(text(k, 12), text(stream_key("hello", Some(1)), 12));
        assert_eq!(text(k, 0), "");
    }

    #[test]
    fn embeddings_have_unit_norm_and_the_asked_dimensions() {
        let v = embedding(stream_key("x", None), 384);
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_eq!(v, embedding(stream_key("x", None), 384));
    }
}
