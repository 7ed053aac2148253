//! Vocabulary files of CTranslate2 model directories: JSON arrays of tokens or text files
//! with one token per line.
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::files::PackageFiles;
use crate::format::json::{self, Json};
use crate::strings::PackedStrings;

/// Cheap to clone: a shared vocabulary serves as source and target without a copy.
#[derive(Debug, Clone)]
pub struct Vocabulary(Arc<Tokens>);

/// The tokens in one string and their ids in an open-addressing table: 1.3 MB for a 65k
/// vocabulary, where a `String` per token and a `HashMap<String, u32>` took 9 MB (two
/// allocations per token and a 4 MB table).
#[derive(Debug)]
struct Tokens {
    texts: PackedStrings,
    /// `id + 1` of the token whose hash starts the probe here (linear probing), 0 where
    /// empty; a power of two long, at most half full.
    index: Vec<u32>,
    unk_id: u32,
}

/// FNV-1a: the table is built once per model and probed once per input token.
fn hash(token: &str) -> usize {
    let h = token.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    h as usize
}

impl Tokens {
    fn token(&self, id: usize) -> &str {
        self.texts.at(id)
    }

    /// The slot of `token` in `index`: where its id is, or the empty slot it would take.
    fn slot(&self, token: &str) -> usize {
        let mask = self.index.len() - 1;
        let mut at = hash(token) & mask;
        while self.index[at] != 0 && self.token(self.index[at] as usize - 1) != token {
            at = (at + 1) & mask;
        }
        at
    }

    fn id(&self, token: &str) -> Option<u32> {
        self.index[self.slot(token)].checked_sub(1)
    }
}

impl Vocabulary {
    /// Builds a vocabulary; `unk_token` must be in it (unknown input tokens map to it).
    pub fn new(tokens: Vec<String>, unk_token: &str) -> Result<Vocabulary> {
        if tokens.is_empty() {
            return Err(Error::invalid_model("vocabulary is empty"));
        }
        let bytes: usize = tokens.iter().map(String::len).sum();
        if tokens.len() > u32::MAX as usize / 2 || bytes > u32::MAX as usize {
            return Err(Error::invalid_model("vocabulary is too large"));
        }
        let mut texts = PackedStrings::with_capacity(tokens.len(), bytes);
        tokens.iter().for_each(|t| texts.push(t));
        let index = vec![0; (2 * tokens.len()).next_power_of_two()];
        drop(tokens);
        let mut vocab = Tokens { texts, index, unk_id: 0 };
        for id in 0..vocab.texts.len() {
            // Like CTranslate2, the first occurrence of a duplicated token wins.
            let at = vocab.slot(vocab.token(id));
            if vocab.index[at] == 0 {
                vocab.index[at] = id as u32 + 1;
            }
        }
        vocab.unk_id = vocab
            .id(unk_token)
            .ok_or_else(|| Error::invalid_model(format!("the unknown token {unk_token:?} is not in the vocabulary")))?;
        Ok(Vocabulary(Arc::new(vocab)))
    }

    /// Reads `<stem>.json` or `<stem>.txt` from `dir` of `files`; `Ok(None)` when neither
    /// exists.
    pub fn load(files: &PackageFiles, dir: &Path, stem: &str, unk_token: &str) -> Result<Option<Vocabulary>> {
        let json_path = dir.join(format!("{stem}.json"));
        let txt_path = dir.join(format!("{stem}.txt"));
        let (path, vocab) = if files.is_file(&json_path) {
            let text = files.read_text(&json_path)?;
            (json_path, Vocabulary::from_json(&text, unk_token))
        } else if files.is_file(&txt_path) {
            let text = files.read_text(&txt_path)?;
            (txt_path, Vocabulary::from_lines(&text, unk_token))
        } else {
            return Ok(None);
        };
        vocab.map(Some).map_err(|e| Error::invalid_model(format!("{}: {}", path.display(), e.message)))
    }

    /// A vocabulary from the text of a `.json` file: a JSON array of token strings.
    pub fn from_json(text: &str, unk_token: &str) -> Result<Vocabulary> {
        let doc = json::parse(text).map_err(Error::invalid_model)?;
        let Json::Array(items) = doc else {
            return Err(Error::invalid_model("expected a JSON array of tokens"));
        };
        let tokens = items
            .into_iter()
            .map(|item| match item {
                Json::String(s) => Ok(s),
                _ => Err(Error::invalid_model("every token must be a string")),
            })
            .collect::<Result<Vec<_>>>()?;
        Vocabulary::new(tokens, unk_token)
    }

    /// A vocabulary from the text of a `.txt` file: one token per line (`\n` or `\r\n`).
    pub fn from_lines(text: &str, unk_token: &str) -> Result<Vocabulary> {
        let tokens = text.lines().map(|l| l.strip_suffix('\r').unwrap_or(l).to_string()).collect();
        Vocabulary::new(tokens, unk_token)
    }

    pub fn len(&self) -> usize {
        self.0.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.texts.is_empty()
    }

    pub fn unk_id(&self) -> u32 {
        self.0.unk_id
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        self.0.id(token)
    }

    /// The id of `token`, or the unknown token's id.
    pub fn id_or_unk(&self, token: &str) -> u32 {
        self.id(token).unwrap_or(self.0.unk_id)
    }

    pub fn token(&self, id: u32) -> &str {
        let id = if (id as usize) < self.len() { id } else { self.0.unk_id };
        self.0.token(id as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_unknown_tokens_and_keeps_first_duplicate() {
        let v = Vocabulary::new(vec!["<unk>".into(), "a".into(), "b".into(), "a".into()], "<unk>").unwrap();
        assert_eq!(v.id_or_unk("a"), 1);
        assert_eq!(v.id_or_unk("zzz"), 0);
        assert_eq!(v.token(2), "b");
        assert_eq!(v.token(99), "<unk>");
        assert!(Vocabulary::new(vec!["a".into()], "<unk>").is_err());
    }

    /// Every token of a vocabulary as large as a real one (with colliding probes) maps to
    /// its first id and back; absent ones, the empty one included, do not map.
    #[test]
    fn every_token_round_trips() {
        let mut tokens: Vec<String> = (0..70_000).map(|i| format!("▁t{i}")).collect();
        tokens[0] = "<unk>".into();
        tokens.push("".into());
        tokens.push("▁t5".into());
        let v = Vocabulary::new(tokens.clone(), "<unk>").unwrap();
        assert_eq!(v.len(), tokens.len());
        for (i, t) in tokens.iter().enumerate().take(tokens.len() - 1) {
            assert_eq!(v.id(t), Some(i as u32), "{t:?}");
            assert_eq!(v.token(i as u32), t);
        }
        assert_eq!(v.id("▁t5"), Some(5));
        assert_eq!(v.id("▁t70000"), None);
        assert_eq!(v.id("t1"), None);
        let single = Vocabulary::new(vec!["<unk>".into()], "<unk>").unwrap();
        assert_eq!((single.id("<unk>"), single.id("")), (Some(0), None));
    }
}
