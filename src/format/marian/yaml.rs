//! The YAML subset Marian and Bergamot files use: the `special:model.yml` config item,
//! Bergamot `config.*.yml` files and Marian YAML vocabularies (`token: id`).
//!
//! Supported: block mappings and lists by indentation (a list may sit under its key at
//! the key's own indent, as yaml-cpp writes `vocabs:\n  - a`), `- key: value` items,
//! flow lists and maps (`[a, b]`, `{}`) on one line, plain, single- and double-quoted
//! scalars (`""` is an empty string, double quotes take YAML's escapes incl. `\uXXXX`),
//! quoted keys, `#` comments, `---` document markers. Not supported (an error naming the
//! line): block scalars (`|`, `>`), multi-line flow or quoted scalars, anchors, tags.
use crate::error::{Error, Result};

/// A parsed YAML node. Scalars stay text; the `as_*` accessors interpret them.
#[derive(Debug, Clone, PartialEq)]
pub enum Yaml {
    Null,
    Scalar(String),
    List(Vec<Yaml>),
    /// Entries in file order (a repeated key keeps both; `get` returns the first).
    Map(Vec<(String, Yaml)>),
}

/// Nesting deeper than this is refused (hostile input would otherwise overflow the stack).
const MAX_DEPTH: usize = 64;

impl Yaml {
    /// The value of `key` in a mapping (`None` for other nodes).
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        self.as_map()?.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Yaml::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// `true/false`, `yes/no`, `on/off`, `1/0` (any case), as yaml-cpp reads booleans.
    pub fn as_bool(&self) -> Option<bool> {
        match self.as_str()?.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" | "y" => Some(true),
            "false" | "no" | "off" | "0" | "n" => Some(false),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        let s = self.as_str()?;
        s.strip_prefix('+').unwrap_or(s).parse().ok()
    }

    /// Also YAML's `.inf`, `-.inf` and `.nan`.
    pub fn as_f64(&self) -> Option<f64> {
        let s = self.as_str()?;
        match s.to_ascii_lowercase().as_str() {
            ".inf" | "+.inf" => Some(f64::INFINITY),
            "-.inf" => Some(f64::NEG_INFINITY),
            ".nan" => Some(f64::NAN),
            _ => s.parse().ok(),
        }
    }

    /// The string at `key` of a mapping: `None` when absent or empty; a list or a mapping
    /// there is an error (taken as absent, a wrong value ran with the default).
    pub fn string_at(&self, key: &str) -> Result<Option<&str>> {
        self.typed_at(key, "a string", Yaml::as_str)
    }

    /// The whole number of at least 0 at `key` (see [`Yaml::string_at`]): `6.7`, `-1` or
    /// `abc` is an error.
    pub fn count_at(&self, key: &str) -> Result<Option<usize>> {
        self.typed_at(key, "a whole number", |v| v.as_i64().and_then(|n| usize::try_from(n).ok()))
    }

    /// The boolean at `key` (see [`Yaml::string_at`] and [`Yaml::as_bool`]).
    pub fn bool_at(&self, key: &str) -> Result<Option<bool>> {
        self.typed_at(key, "true or false", Yaml::as_bool)
    }

    fn typed_at<'y, T>(&'y self, key: &str, expected: &str, read: impl Fn(&'y Yaml) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None | Some(Yaml::Null) => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| {
                let shown = match v {
                    Yaml::Scalar(s) => format!("{s:?}"),
                    Yaml::List(_) => "a list".into(),
                    Yaml::Map(_) => "a mapping".into(),
                    Yaml::Null => "empty".into(),
                };
                Error::invalid_model(format!("{key} is {shown}, expected {expected}"))
            }),
        }
    }

    pub fn as_list(&self) -> Option<&[Yaml]> {
        match self {
            Yaml::List(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(String, Yaml)]> {
        match self {
            Yaml::Map(v) => Some(v),
            _ => None,
        }
    }
}

/// Parses a whole document; an empty one is `Null`.
pub fn parse(text: &str) -> Result<Yaml> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        let content = strip_comment(raw).trim_end();
        let indent = content.len() - content.trim_start_matches(' ').len();
        let body = &content[indent..];
        if body.is_empty() || body == "---" || body == "..." {
            continue;
        }
        if body.starts_with('\t') {
            return Err(err(number, "a tab in the indentation"));
        }
        lines.push(Line { number, indent, text: body.to_string() });
    }
    let mut p = Parser { lines, pos: 0 };
    let Some(first) = p.lines.first() else { return Ok(Yaml::Null) };
    let value = p.block(first.indent, 0)?;
    match p.lines.get(p.pos) {
        Some(l) => Err(err(l.number, "unexpected content (check the indentation)")),
        None => Ok(value),
    }
}

fn err(line: usize, what: &str) -> Error {
    Error::invalid_model(format!("YAML line {line}: {what}"))
}

struct Line {
    number: usize,
    indent: usize,
    text: String,
}

struct Parser {
    lines: Vec<Line>,
    pos: usize,
}

impl Parser {
    /// The node whose first line is the current one, at `indent`.
    fn block(&mut self, indent: usize, depth: usize) -> Result<Yaml> {
        let line = &self.lines[self.pos];
        if depth > MAX_DEPTH {
            return Err(err(line.number, "nesting too deep"));
        }
        if is_item(&line.text) {
            self.list(indent, depth)
        } else if split_key(&line.text, line.number)?.is_some() {
            self.map(indent, depth)
        } else {
            let value = inline_value(&line.text, line.number, depth)?;
            self.pos += 1;
            Ok(value)
        }
    }

    /// The value after `key:` with nothing on its line: a deeper block, a list at the
    /// key's own indent, or null.
    fn nested(&mut self, indent: usize, depth: usize) -> Result<Yaml> {
        match self.lines.get(self.pos) {
            Some(l) if l.indent > indent => self.block(l.indent, depth + 1),
            Some(l) if l.indent == indent && is_item(&l.text) => self.list(indent, depth + 1),
            _ => Ok(Yaml::Null),
        }
    }

    fn map(&mut self, indent: usize, depth: usize) -> Result<Yaml> {
        let mut entries = Vec::new();
        while let Some(line) = self.lines.get(self.pos) {
            if line.indent < indent {
                break;
            }
            let number = line.number;
            if line.indent > indent {
                return Err(err(number, "unexpected indentation"));
            }
            let entry = if is_item(&line.text) { None } else { split_key(&line.text, number)? };
            let Some((key, rest)) = entry else {
                return Err(err(number, "expected `key: value` in a mapping"));
            };
            let rest = rest.to_string();
            self.pos += 1;
            let value = if rest.is_empty() { self.nested(indent, depth)? } else { inline_value(&rest, number, depth)? };
            entries.push((key, value));
        }
        Ok(Yaml::Map(entries))
    }

    fn list(&mut self, indent: usize, depth: usize) -> Result<Yaml> {
        let mut items = Vec::new();
        while let Some(line) = self.lines.get(self.pos) {
            if line.indent < indent || (line.indent == indent && !is_item(&line.text)) {
                break;
            }
            let number = line.number;
            if line.indent > indent {
                return Err(err(number, "unexpected indentation"));
            }
            let rest = line.text[1..].trim_start_matches(' ');
            if rest.is_empty() {
                self.pos += 1;
                items.push(match self.lines.get(self.pos) {
                    Some(l) if l.indent > indent => self.block(l.indent, depth + 1)?,
                    _ => Yaml::Null,
                });
            } else {
                // `- key: value` or `- - x`: the rest of the line opens a block at the
                // column it starts in; parse it as a line of its own.
                let column = indent + (line.text.len() - rest.len());
                let rest = rest.to_string();
                self.lines[self.pos].indent = column;
                self.lines[self.pos].text = rest;
                items.push(self.block(column, depth + 1)?);
            }
        }
        Ok(Yaml::List(items))
    }
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// Drops a comment: `#` at the start or after a blank, outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev: Option<char> = None; // the previous character
    let mut last_token: Option<char> = None; // the previous non-blank character
    let mut escaped = false;
    let mut closed_single = false; // just closed a single quote: `''` reopens it
    for (i, c) in line.char_indices() {
        let reopen = std::mem::take(&mut closed_single) && c == '\'';
        match quote {
            None if reopen => quote = Some('\''),
            Some('\'') if c == '\'' => {
                quote = None;
                closed_single = true;
            }
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => {
                let at_start = matches!(last_token, None | Some(':' | '-' | '[' | '{' | ',' | '?'));
                if (c == '"' || c == '\'') && at_start && prev.is_none_or(|p| p == ' ' || "[{,".contains(p)) {
                    quote = Some(c);
                } else if c == '#' && prev.is_none_or(|p| p == ' ' || p == '\t') {
                    return &line[..i];
                }
            }
        }
        prev = Some(c);
        if c != ' ' && c != '\t' {
            last_token = Some(c);
        }
    }
    line
}

/// Splits `key: rest` (a quoted or plain key, then `:` and a blank or the line's end);
/// `None` when the line is not a mapping entry.
fn split_key(text: &str, line: usize) -> Result<Option<(String, &str)>> {
    if let Some(q @ ('"' | '\'')) = text.chars().next() {
        let (key, used) = quoted(text, q, line)?;
        let after = text[used..].trim_start_matches(' ');
        return Ok(after.strip_prefix(':').filter(|r| r.is_empty() || r.starts_with(' ')).map(|r| (key, r.trim())));
    }
    if text.starts_with(['[', '{']) {
        return Ok(None);
    }
    let bytes = text.as_bytes();
    for i in 0..bytes.len() {
        if bytes[i] == b':' && (i + 1 == bytes.len() || bytes[i + 1] == b' ') {
            let key = text[..i].trim_end();
            return Ok(Some((key.to_string(), text[i + 1..].trim())));
        }
    }
    Ok(None)
}

/// A value written on one line: flow collection, quoted or plain scalar.
fn inline_value(text: &str, line: usize, depth: usize) -> Result<Yaml> {
    if text.starts_with(['|', '>']) {
        return Err(err(line, "block scalars (| and >) are not supported"));
    }
    if text.starts_with(['&', '*', '!']) {
        return Err(err(line, "anchors, aliases and tags are not supported"));
    }
    let mut flow = Flow { text, at: 0, line };
    let value = flow.value(depth, false)?;
    flow.blanks();
    if flow.at != text.len() {
        return Err(err(line, "unexpected text after a value"));
    }
    Ok(value)
}

/// A cursor over one line of flow YAML.
struct Flow<'a> {
    text: &'a str,
    at: usize,
    line: usize,
}

impl Flow<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn blanks(&mut self) {
        self.at = self.text.len() - self.rest().trim_start_matches([' ', '\t']).len();
    }

    /// A value; `in_flow` stops plain scalars at `,`, `]` and `}`.
    fn value(&mut self, depth: usize, in_flow: bool) -> Result<Yaml> {
        if depth > MAX_DEPTH {
            return Err(err(self.line, "nesting too deep"));
        }
        self.blanks();
        match self.rest().chars().next() {
            Some('[') => self.list(depth),
            Some('{') => self.map(depth),
            Some(q @ ('"' | '\'')) => {
                let (s, used) = quoted(self.rest(), q, self.line)?;
                self.at += used;
                Ok(Yaml::Scalar(s))
            }
            _ => {
                let rest = self.rest();
                let end = if in_flow { rest.find([',', ']', '}']).unwrap_or(rest.len()) } else { rest.len() };
                let value = plain(rest[..end].trim_end());
                self.at += end;
                Ok(value)
            }
        }
    }

    fn list(&mut self, depth: usize) -> Result<Yaml> {
        self.at += 1; // '['
        let mut items = Vec::new();
        loop {
            self.blanks();
            if self.eat(']') {
                return Ok(Yaml::List(items));
            }
            items.push(self.value(depth + 1, true)?);
            self.blanks();
            if !self.eat(',') && !self.rest().starts_with(']') {
                return Err(err(self.line, "expected `,` or `]` in a flow list"));
            }
        }
    }

    fn map(&mut self, depth: usize) -> Result<Yaml> {
        self.at += 1; // '{'
        let mut entries = Vec::new();
        loop {
            self.blanks();
            if self.eat('}') {
                return Ok(Yaml::Map(entries));
            }
            let key = self.key()?;
            self.blanks();
            let value = if self.eat(':') { self.value(depth + 1, true)? } else { Yaml::Null };
            entries.push((key, value));
            self.blanks();
            if !self.eat(',') && !self.rest().starts_with('}') {
                return Err(err(self.line, "expected `,` or `}` in a flow map"));
            }
        }
    }

    /// A flow map key: quoted, or plain up to `: `, `,` or `}`.
    fn key(&mut self) -> Result<String> {
        let rest = self.rest();
        if let Some(q @ ('"' | '\'')) = rest.chars().next() {
            let (s, used) = quoted(rest, q, self.line)?;
            self.at += used;
            return Ok(s);
        }
        let b = rest.as_bytes();
        let mut end = b.len();
        for i in 0..b.len() {
            let colon = b[i] == b':' && matches!(b.get(i + 1), None | Some(b' ' | b',' | b'}'));
            if colon || b[i] == b',' || b[i] == b'}' {
                end = i;
                break;
            }
        }
        let key = rest[..end].trim_end().to_string();
        self.at += end;
        Ok(key)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.rest().starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }
}

/// A plain scalar: empty, `~` and `null` are null (YAML's core schema), the rest text.
fn plain(s: &str) -> Yaml {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => Yaml::Null,
        _ => Yaml::Scalar(s.to_string()),
    }
}

/// A quoted scalar at the start of `text` (opening quote `q`): its value and the bytes
/// it spans, closing quote included.
fn quoted(text: &str, q: char, line: usize) -> Result<(String, usize)> {
    let mut out = String::new();
    let mut chars = text.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == q {
            if q == '\'' && text[i + 1..].starts_with('\'') {
                chars.next();
                out.push('\'');
                continue;
            }
            return Ok((out, i + 1));
        }
        if c == '\\' && q == '"' {
            let Some((_, e)) = chars.next() else { break };
            let hex = |chars: &mut dyn Iterator<Item = (usize, char)>, n: usize| -> Result<u32> {
                let digits: String = chars.take(n).map(|(_, c)| c).collect();
                match u32::from_str_radix(&digits, 16) {
                    Ok(v) if digits.len() == n && digits.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(v),
                    _ => Err(err(line, "bad hexadecimal escape")),
                }
            };
            let c = match e {
                '0' => '\0',
                'a' => '\x07',
                'b' => '\x08',
                't' | '\t' => '\t',
                'n' => '\n',
                'v' => '\x0b',
                'f' => '\x0c',
                'r' => '\r',
                'e' => '\x1b',
                ' ' => ' ',
                '"' => '"',
                '/' => '/',
                '\\' => '\\',
                'N' => '\u{85}',
                '_' => '\u{a0}',
                'L' => '\u{2028}',
                'P' => '\u{2029}',
                'x' => char_from(hex(&mut chars, 2)?, line)?,
                'U' => char_from(hex(&mut chars, 8)?, line)?,
                'u' => {
                    let hi = hex(&mut chars, 4)?;
                    if (0xd800..0xdc00).contains(&hi) {
                        // A UTF-16 surrogate pair written as two escapes.
                        let low = match (chars.next(), chars.next()) {
                            (Some((_, '\\')), Some((_, 'u'))) => hex(&mut chars, 4)?,
                            _ => return Err(err(line, "a lone UTF-16 surrogate in an escape")),
                        };
                        if !(0xdc00..0xe000).contains(&low) {
                            return Err(err(line, "a lone UTF-16 surrogate in an escape"));
                        }
                        char_from(0x10000 + ((hi - 0xd800) << 10) + (low - 0xdc00), line)?
                    } else {
                        char_from(hi, line)?
                    }
                }
                _ => return Err(err(line, &format!("unknown escape \\{e}"))),
            };
            out.push(c);
            continue;
        }
        out.push(c);
    }
    Err(err(line, "unterminated quoted scalar (multi-line scalars are not supported)"))
}

fn char_from(v: u32, line: usize) -> Result<char> {
    char::from_u32(v).ok_or_else(|| err(line, "an escape that is not a Unicode scalar value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Yaml {
        Yaml::Scalar(v.into())
    }

    /// Typed settings: absent or empty is `None`, the wrong kind an error naming the key.
    #[test]
    fn typed_settings_refuse_the_wrong_kind() {
        let y = parse("heads: 8\nfrac: 6.7\nneg: -1\nword: abc\nlist: [relu]\nmap: {}\nempty:\nyes: on\n").unwrap();
        assert_eq!(y.count_at("heads").unwrap(), Some(8));
        assert_eq!(y.count_at("missing").unwrap(), None);
        assert_eq!(y.count_at("empty").unwrap(), None);
        assert_eq!(y.string_at("word").unwrap(), Some("abc"));
        assert_eq!(y.bool_at("yes").unwrap(), Some(true));
        for (key, shown) in [("frac", "\"6.7\""), ("neg", "\"-1\""), ("word", "\"abc\""), ("list", "a list")] {
            let e = y.count_at(key).unwrap_err();
            assert_eq!(e.message, format!("{key} is {shown}, expected a whole number"));
        }
        assert!(y.string_at("list").unwrap_err().message.contains("list is a list, expected a string"));
        assert!(y.string_at("map").unwrap_err().message.contains("a mapping"));
        assert!(y.bool_at("word").unwrap_err().message.contains("expected true or false"));
    }

    #[test]
    fn marian_config() {
        let y = parse(
            "relative-paths: true\nmodels:\n  - model.bin\nvocabs:\n- a.spm   \n- 'b c.spm'\nshortlist:\n    - lex.bin\n    - false\nbeam-size: 1 # comment\n# full line\ninput-types: []\ntop: \"\"\nversion: v1.9 94aeaa46 2021-04-28 00:28:35 +0100\nempty:\nnested:\n  a: {x: 1, y: [2, 3]}\n  b:\n    - k: v\n      k2: v2\n    - - deep\n",
        )
        .unwrap();
        assert_eq!(y.get("relative-paths").and_then(Yaml::as_bool), Some(true));
        assert_eq!(y.get("models").unwrap().as_list().unwrap(), &[s("model.bin")]);
        assert_eq!(y.get("vocabs").unwrap().as_list().unwrap(), &[s("a.spm"), s("b c.spm")]);
        let sl = y.get("shortlist").unwrap().as_list().unwrap();
        assert_eq!(sl[1].as_bool(), Some(false));
        assert_eq!(y.get("beam-size").and_then(Yaml::as_i64), Some(1));
        assert_eq!(y.get("input-types").unwrap().as_list().unwrap().len(), 0);
        assert_eq!(y.get("top").and_then(Yaml::as_str), Some(""));
        assert_eq!(y.get("version").and_then(Yaml::as_str), Some("v1.9 94aeaa46 2021-04-28 00:28:35 +0100"));
        assert_eq!(y.get("empty"), Some(&Yaml::Null));
        let a = y.get("nested").unwrap().get("a").unwrap();
        assert_eq!(a.get("y").unwrap().as_list().unwrap(), &[s("2"), s("3")]);
        let b = y.get("nested").unwrap().get("b").unwrap().as_list().unwrap();
        assert_eq!(b[0].get("k2").and_then(Yaml::as_str), Some("v2"));
        assert_eq!(b[1].as_list().unwrap(), &[s("deep")]);
    }

    #[test]
    fn vocabulary_keys_and_escapes() {
        let y = parse("\"</s>\": 0\n\"<unk>\": 1\n▁the: 2\n\"\\u00e9\\\"#\": 3\n'it''s': 4\n\"\\ud83d\\ude00\": 5\n\"#\": 6\na:b: 7\n").unwrap();
        let m = y.as_map().unwrap();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["</s>", "<unk>", "▁the", "é\"#", "it's", "😀", "#", "a:b"]);
        assert_eq!(m[7].1.as_i64(), Some(7));
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line) in [
            ("a: 1\n  b: 2\n", 2),
            ("a: \"open\n", 1),
            ("a: 1\nb: [1, 2\n", 2),
            ("a: |\n  x\n", 1),
            ("a:\n\t- x\n", 2),
            ("a: \"\\q\"\n", 1),
            ("- a\nb: 1\n", 2),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.message.contains(&format!("line {line}")), "{text:?}: {}", e.message);
        }
        let deep = "[".repeat(1000);
        assert!(parse(&deep).is_err());
        let deep: String = (0..200).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        assert!(parse(&deep).is_err());
    }
}
