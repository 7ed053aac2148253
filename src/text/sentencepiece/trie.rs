//! A byte trie over the vocabulary's pieces, stored as a double array (one addition and
//! one comparison per byte). Built without recursion (a piece may be arbitrarily long).

pub const NO_VALUE: u32 = u32::MAX;
const FREE: u32 = u32::MAX;
/// How far below the highest slot taken a node's children are looked for a place.
const SEARCH_WINDOW: usize = 1024;

/// A sorted-edge trie, the intermediate form the double array is built from.
struct Node {
    start: u32,
    len: u32,
    value: u32,
}

/// A double-array trie: the child of `node` by byte `b` is `base[node] + b` when that
/// slot's `check` is `node`.
pub struct PieceTrie {
    base: Vec<u32>,
    check: Vec<u32>,
    values: Vec<u32>,
    /// Per node, a score and a tag for the value (`set_scores`), beside it in memory.
    scores: Vec<(f32, u8)>,
    /// Build only: a slot at or before the next free one (path-compressed skips).
    skip: Vec<u32>,
}

impl PieceTrie {
    /// Builds the trie from non-empty keys and their values (the first of equal keys wins).
    pub fn new(mut keys: Vec<(&[u8], u32)>) -> PieceTrie {
        keys.sort_by(|a, b| a.0.cmp(b.0));
        keys.dedup_by(|a, b| a.0 == b.0);
        let mut nodes = vec![Node {
            start: 0,
            len: 0,
            value: NO_VALUE,
        }];
        let mut labels: Vec<u8> = Vec::new();
        let mut children: Vec<u32> = Vec::new();
        // (node, keys range, depth); no recursion, a key may be arbitrarily long.
        let mut work = vec![(0usize, 0usize, keys.len(), 0usize)];
        while let Some((node, mut lo, hi, depth)) = work.pop() {
            if lo < hi && keys[lo].0.len() == depth {
                nodes[node].value = keys[lo].1;
                lo += 1;
            }
            let start = labels.len();
            let mut i = lo;
            while i < hi {
                let b = keys[i].0[depth];
                let mut j = i + 1;
                while j < hi && keys[j].0[depth] == b {
                    j += 1;
                }
                let child = nodes.len();
                nodes.push(Node {
                    start: 0,
                    len: 0,
                    value: NO_VALUE,
                });
                labels.push(b);
                children.push(child as u32);
                work.push((child, i, j, depth + 1));
                i = j;
            }
            nodes[node].start = start as u32;
            nodes[node].len = (labels.len() - start) as u32;
        }
        // Place the nodes into a double array, first fit, breadth first.
        let cap = nodes.len() * 2 + 512;
        let mut t = PieceTrie {
            base: vec![0; cap],
            check: vec![FREE; cap],
            values: vec![NO_VALUE; cap],
            scores: Vec::new(),
            skip: (1..=cap as u32).collect(),
        };
        t.check[0] = FREE - 1; // the root is taken
        // Where the last search found its first free slot: none is free before it (the
        // window aside).
        let mut search_from = 1usize;
        // The highest slot taken. Searches start at most SEARCH_WINDOW slots below it: the
        // holes further back, which seldom fit a node's children, are given up (as
        // darts-clone gives up old blocks). Scanning them from the first free slot every
        // time had been two thirds of building zh-en's trie (18 of 28 ms).
        let mut high = 0usize;
        let mut queue = std::collections::VecDeque::from([(0usize, 0usize)]);
        while let Some((tn, dn)) = queue.pop_front() {
            t.values[dn] = nodes[tn].value;
            let (s, l) = (nodes[tn].start as usize, nodes[tn].len as usize);
            if l == 0 {
                continue;
            }
            let ls = &labels[s..s + l];
            search_from = t.find_free(search_from.max(high.saturating_sub(SEARCH_WINDOW)));
            let mut pos = search_from;
            let base = loop {
                if pos > ls[0] as usize {
                    let b = pos - ls[0] as usize;
                    t.grow(b + 256);
                    if ls.iter().all(|&c| t.check[b + c as usize] == FREE) {
                        break b;
                    }
                }
                pos = t.find_free(pos + 1);
            };
            t.base[dn] = base as u32;
            high = high.max(base + *ls.last().expect("l > 0") as usize);
            for (k, &c) in ls.iter().enumerate() {
                t.check[base + c as usize] = dn as u32;
                queue.push_back((children[s + k] as usize, base + c as usize));
            }
        }
        // Keep every `base + 255` inside the arrays so a lookup needs one bounds check.
        let used = t.check.iter().rposition(|&c| c != FREE).unwrap_or(0) + 257;
        t.grow(used);
        // The build reserved twice the nodes' slots; hand the rest back (1.4 MB of zh-en's
        // 4.7 MB SentencePiece model in memory).
        for v in [&mut t.base, &mut t.check, &mut t.values] {
            v.truncate(used);
            v.shrink_to_fit();
        }
        t.skip = Vec::new();
        t
    }

    /// Attaches `f(value)` (a score and a tag) to every node holding a value.
    pub fn set_scores(&mut self, f: impl Fn(u32) -> (f32, u8)) {
        self.scores = self
            .values
            .iter()
            .map(|&v| if v == NO_VALUE { (0.0, 0) } else { f(v) })
            .collect();
    }

    /// The value at `node` with its score and tag (after `set_scores`).
    #[inline]
    pub fn entry(&self, node: u32) -> Option<(u32, f32, u8)> {
        let v = self.values[node as usize];
        if v == NO_VALUE {
            return None;
        }
        let (s, t) = self.scores.get(node as usize).copied().unwrap_or((0.0, 0));
        Some((v, s, t))
    }

    /// The first free slot at or after `i`.
    fn find_free(&mut self, i: usize) -> usize {
        self.grow(i + 1);
        let mut r = i;
        while self.check[r] != FREE {
            r = self.skip[r] as usize;
            self.grow(r + 1);
        }
        let mut j = i;
        while j != r {
            let n = self.skip[j] as usize;
            self.skip[j] = r as u32;
            j = n;
        }
        r
    }

    fn grow(&mut self, len: usize) {
        if self.check.len() < len {
            let n = len.max(self.check.len() * 3 / 2);
            self.base.resize(n, 0);
            self.check.resize(n, FREE);
            self.values.resize(n, NO_VALUE);
            let from = self.skip.len() as u32;
            self.skip.extend(from + 1..=n as u32);
        }
    }

    pub const ROOT: u32 = 0;

    #[inline]
    pub fn child(&self, node: u32, b: u8) -> Option<u32> {
        let c = *self.base.get(node as usize)? as usize + b as usize;
        if *self.check.get(c)? == node {
            Some(c as u32)
        } else {
            None
        }
    }

    /// The value stored at `node`, if a key ends there.
    #[inline]
    pub fn value(&self, node: u32) -> Option<u32> {
        let v = self.values[node as usize];
        if v == NO_VALUE {
            None
        } else {
            Some(v)
        }
    }

    /// The longest key that is a prefix of `input`: (length, value).
    pub fn longest_prefix(&self, input: &[u8]) -> Option<(usize, u32)> {
        let mut node = Self::ROOT;
        let mut best = None;
        for (i, &b) in input.iter().enumerate() {
            match self.child(node, b) {
                Some(c) => node = c,
                None => break,
            }
            if let Some(v) = self.value(node) {
                best = Some((i + 1, v));
            }
        }
        best
    }

    /// The value of exactly `key`.
    pub fn get(&self, key: &[u8]) -> Option<u32> {
        let mut node = Self::ROOT;
        for &b in key {
            node = self.child(node, b)?;
        }
        if key.is_empty() {
            return None;
        }
        self.value(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enough keys that the placement's search window matters (the array grows far past
    /// SEARCH_WINDOW): every key is found with its value, and no other string is, also
    /// keys sharing long prefixes and bytes of every value.
    #[test]
    fn every_key_and_only_the_keys_are_found() {
        // 1 to 12 bytes: narrow ones at first (many shared prefixes), any byte later.
        fn random_key(seed: &mut u64) -> Vec<u8> {
            let mut next = || {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (*seed >> 33) as u32
            };
            let len = 1 + next() as usize % 12;
            (0..len).map(|i| if i < 3 { b'a' + (next() % 6) as u8 } else { next() as u8 }).collect()
        }
        let mut seed = 12345u64;
        let keys: Vec<Vec<u8>> = (0..50_000).map(|_| random_key(&mut seed)).collect();
        let trie = PieceTrie::new(keys.iter().enumerate().map(|(i, k)| (&k[..], i as u32)).collect());
        let mut first: std::collections::HashMap<&[u8], u32> = std::collections::HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            first.entry(&k[..]).or_insert(i as u32);
        }
        for (k, &v) in &first {
            assert_eq!(trie.get(k), Some(v), "{k:?}");
            assert_eq!(trie.longest_prefix(k).map(|(n, _)| n), Some(k.len()), "{k:?}");
        }
        for _ in 0..20_000 {
            let k = random_key(&mut seed);
            assert_eq!(trie.get(&k), first.get(&k[..]).copied(), "{k:?}");
        }
        assert!(trie.check.len() > 4 * SEARCH_WINDOW);
    }
}
