//! An embed model's longest input, in tokens with [CLS] and [SEP], from its directory's two
//! small JSON files: `sentence_bert_config.json`'s `max_seq_length` when the file exists and
//! sets it (sentence-transformers truncates there), else `config.json`'s
//! `max_position_embeddings`.
//!
//! Always compiled (serde_json only, no candle): the config check reads it for a model
//! whose `context_length` is omitted, with or without the `embed` feature, and
//! [`model_dir`](super::model_dir) applies the same [`rule`] when it loads the model, so
//! the router's limit and the executor's can never disagree. Nothing else is read here.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The encoder's `config.json`, only what this needs.
#[derive(Debug, Deserialize)]
struct EncoderConfig {
    max_position_embeddings: usize,
}

/// `sentence_bert_config.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct SentenceBertConfig {
    pub(crate) max_seq_length: Option<usize>,
}

/// Why a directory's longest input cannot be read: the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqLenError {
    pub path: PathBuf,
    pub why: String,
}

/// The longest input: `max_seq_length` when `sentence_bert` sets it, else
/// `max_position_embeddings`; it must lie in `2..=max_position_embeddings` (room for [CLS]
/// and [SEP], and no position the encoder has no embedding for).
pub fn rule(
    max_position_embeddings: usize,
    sentence_bert_max_seq_length: Option<usize>,
) -> Result<usize, String> {
    let max_seq_length = sentence_bert_max_seq_length.unwrap_or(max_position_embeddings);
    if max_seq_length < 2 || max_seq_length > max_position_embeddings {
        return Err(format!(
            "max_seq_length {max_seq_length} must be in 2..={max_position_embeddings} \
             (config.json's max_position_embeddings)"
        ));
    }
    Ok(max_seq_length)
}

fn json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, SeqLenError> {
    let err = |why: String| SeqLenError {
        path: path.to_path_buf(),
        why,
    };
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| err(format!("not the expected JSON: {e}")))
}

/// `sentence_bert_config.json`'s `max_seq_length` in `dir`, `None` when the file is absent
/// or does not set it.
pub(crate) fn sentence_bert_max_seq_length(dir: &Path) -> Result<Option<usize>, SeqLenError> {
    let path = dir.join("sentence_bert_config.json");
    if !path.exists() {
        return Ok(None);
    }
    Ok(json::<SentenceBertConfig>(&path)?.max_seq_length)
}

/// Reads `dir`'s longest input (see the module doc).
pub fn read(dir: &Path) -> Result<usize, SeqLenError> {
    if !dir.is_dir() {
        return Err(SeqLenError {
            path: dir.to_path_buf(),
            why: "is not a directory; model_dir must name a sentence-transformers model \
                  directory"
                .into(),
        });
    }
    let config_path = dir.join("config.json");
    let encoder: EncoderConfig = json(&config_path)?;
    let st = sentence_bert_max_seq_length(dir)?;
    rule(encoder.max_position_embeddings, st).map_err(|why| SeqLenError {
        path: if st.is_some() {
            dir.join("sentence_bert_config.json")
        } else {
            config_path
        },
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the target dir, holding `files` (name, contents).
    fn dir_with(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("abe-seq-len-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        dir
    }

    #[test]
    fn sentence_bert_max_seq_length_wins_over_the_encoders_positions() {
        // all-MiniLM-L6-v2: 512 positions, run by sentence-transformers at 256.
        let d = dir_with(
            "minilm",
            &[
                (
                    "config.json",
                    r#"{"max_position_embeddings": 512, "hidden_size": 384}"#,
                ),
                ("sentence_bert_config.json", r#"{"max_seq_length": 256}"#),
            ],
        );
        assert_eq!(read(&d), Ok(256));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn without_sentence_bert_config_the_positions_are_the_limit() {
        let d = dir_with(
            "bare",
            &[("config.json", r#"{"max_position_embeddings": 512}"#)],
        );
        assert_eq!(read(&d), Ok(512));
        let d2 = dir_with(
            "unset",
            &[
                ("config.json", r#"{"max_position_embeddings": 128}"#),
                ("sentence_bert_config.json", r#"{"do_lower_case": false}"#),
            ],
        );
        assert_eq!(read(&d2), Ok(128));
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&d2).unwrap();
    }

    #[test]
    fn a_missing_or_impossible_limit_names_the_file() {
        let nowhere =
            std::env::temp_dir().join(format!("abe-seq-len-{}-nowhere", std::process::id()));
        let e = read(&nowhere).unwrap_err();
        assert!(
            e.path == nowhere && e.why.contains("not a directory"),
            "{e:?}"
        );
        let d = dir_with("none", &[]);
        let e = read(&d).unwrap_err();
        assert!(
            e.path.ends_with("config.json") && e.why.contains("cannot read"),
            "{e:?}"
        );
        let d2 = dir_with(
            "too-long",
            &[
                ("config.json", r#"{"max_position_embeddings": 512}"#),
                ("sentence_bert_config.json", r#"{"max_seq_length": 1024}"#),
            ],
        );
        let e = read(&d2).unwrap_err();
        assert!(
            e.path.ends_with("sentence_bert_config.json") && e.why.contains("2..=512"),
            "{e:?}"
        );
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&d2).unwrap();
    }
}
