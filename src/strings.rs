//! Many small strings in one buffer (a vocabulary's tokens, a SentencePiece model's
//! pieces): one allocation and a 4-byte offset each, where a `String` apiece costs a
//! 24-byte header and a heap block of at least 32 bytes (65k tokens: 1 MB instead of 4).

/// Strings one after another: string `i` is `text[ends[i - 1]..ends[i]]`. The text must
/// stay below 4 GiB (the offsets are `u32`): callers check the total before pushing.
#[derive(Debug, Default)]
pub(crate) struct PackedStrings {
    text: String,
    ends: Vec<u32>,
}

impl PackedStrings {
    /// Room for `count` strings of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> PackedStrings {
        let mut strings = PackedStrings { text: String::new(), ends: Vec::new() };
        strings.text.reserve_exact(bytes);
        strings.ends.reserve_exact(count);
        strings
    }

    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        debug_assert!(self.text.len() <= u32::MAX as usize, "packed strings past 4 GiB");
        self.ends.push(self.text.len() as u32);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`; panics past the end.
    pub fn at(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// String `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&str> {
        (i < self.len()).then(|| self.at(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_come_back_as_pushed() {
        let words = ["", "a", "", "▁héllo", "<0x0A>", ""];
        let mut strings = PackedStrings::with_capacity(words.len(), words.iter().map(|w| w.len()).sum());
        words.iter().for_each(|w| strings.push(w));
        assert_eq!(strings.len(), words.len());
        assert!(words.iter().enumerate().all(|(i, w)| strings.at(i) == *w && strings.get(i) == Some(*w)));
        assert_eq!(strings.get(words.len()), None);
        assert!(PackedStrings::default().is_empty());
    }
}
