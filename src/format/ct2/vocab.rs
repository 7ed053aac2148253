//! Vocabulary files of CTranslate2 model directories: JSON arrays of tokens or text files
//! with one token per line.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::files::PackageFiles;
use crate::format::json::{self, Json};

/// Cheap to clone: a shared vocabulary serves as source and target without a copy
/// (6 MB for a 65k vocabulary).
#[derive(Debug, Clone)]
pub struct Vocabulary(Arc<Tokens>);

#[derive(Debug)]
struct Tokens {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    unk_id: u32,
}

impl Vocabulary {
    /// Builds a vocabulary; `unk_token` must be in it (unknown input tokens map to it).
    pub fn new(tokens: Vec<String>, unk_token: &str) -> Result<Vocabulary> {
        if tokens.is_empty() {
            return Err(Error::invalid_model("vocabulary is empty"));
        }
        if tokens.len() > u32::MAX as usize / 2 {
            return Err(Error::invalid_model("vocabulary is too large"));
        }
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // Like CTranslate2, the first occurrence of a duplicated token wins.
            ids.entry(t.clone()).or_insert(i as u32);
        }
        let unk_id = *ids
            .get(unk_token)
            .ok_or_else(|| Error::invalid_model(format!("the unknown token {unk_token:?} is not in the vocabulary")))?;
        Ok(Vocabulary(Arc::new(Tokens { tokens, ids, unk_id })))
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
        self.0.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.tokens.is_empty()
    }

    pub fn unk_id(&self) -> u32 {
        self.0.unk_id
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        self.0.ids.get(token).copied()
    }

    /// The id of `token`, or the unknown token's id.
    pub fn id_or_unk(&self, token: &str) -> u32 {
        self.id(token).unwrap_or(self.0.unk_id)
    }

    pub fn token(&self, id: u32) -> &str {
        self.0.tokens.get(id as usize).map(String::as_str).unwrap_or_else(|| &self.0.tokens[self.0.unk_id as usize])
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
}
