//! Streaming translation: lines from a reader to a writer, a chunk of lines at a time, so
//! that memory stays bounded whatever the size of the input (a file larger than memory, a
//! pipe that never ends).
//!
//! Each chunk of `read_batch_size` lines is submitted as one job: the library sorts its
//! sentences by length and cuts them into batches as usual. Two chunks are in flight at
//! once, so the workers translate one while this thread writes the one before and reads
//! and prepares (splits, tokenizes) the one after; a third is never read before the
//! oldest is written. Translations are written in input order, and flushed per chunk.
//!
//! Every input line is one text (text mode: cut into sentences per [`TextOptions`]; an
//! empty line stays empty) or, with [`StreamOptions::tokens`], one sentence of
//! space-separated tokens (one output line per hypothesis). A line ends at `\n`, and one
//! `\r` before it goes with it; anything else, a lone `\r` or a NUL byte included, is part
//! of the line. A line that is not valid UTF-8 is an error naming it: the library
//! translates Unicode text, as CTranslate2's `translate_file` does (Marian instead turns
//! invalid bytes into U+FFFD; do that beforehand, e.g. `iconv -c`, to get its behaviour).
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::translate::{TextOptions, TextTranslation, DEFAULT_TEXT_BATCH_SIZE};
use crate::decode::Rng;
use crate::error::{Error, Result};
use crate::translator::{BatchType, Job, TranslateOptions, TranslationResult};
use crate::{BatchHooks, TextHooks, Translator};

/// The default chunk: this many batches of the options' size.
const BATCHES_PER_CHUNK: usize = 8;
/// Chunks submitted and not yet written: one translating while the next is read.
const CHUNKS_IN_FLIGHT: usize = 2;
/// Buffer of the file and standard stream readers and writers.
const IO_BUFFER: usize = 1 << 16;

/// How a stream is read, beside the translation and text options.
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// Lines read and submitted at once; 0 = 8 batches' worth (8 x `max_batch_size`
    /// sentences, 8 x 32 when it is 0 or counts tokens).
    pub read_batch_size: usize,
    /// Lines are space-separated tokens in and out (n-best: one line per hypothesis),
    /// instead of text.
    pub tokens: bool,
    /// The number of input lines, when known beforehand: the total given to `progress`
    /// from the start (else 0 until the end of the input is read).
    pub total_lines: Option<usize>,
}

/// Translates `input` line by line into `output` (see the module's documentation for the
/// format). `progress(lines_done, lines_total)` is called on this thread as batches end and
/// chunks are written: `lines_total` is 0 while unknown (neither given nor the end of the
/// input read); in text mode `lines_done` inside a chunk is estimated from its translated
/// sentences. Returning false cancels what is in flight and ends with a `Cancelled` error.
/// Returns the number of lines translated. On an error, the chunks already written stay
/// written; nothing of this call runs any more once it returns.
pub fn translate_stream<R: BufRead, W: Write>(
    translator: &Translator,
    input: R,
    output: W,
    options: &TranslateOptions,
    text_options: &TextOptions,
    stream: &StreamOptions,
    progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<usize> {
    let streamer = Streamer::new(translator, options, text_options, stream)?;
    let mut output = output;
    streamer.run(&mut LineReader::new(input, "the input"), &mut Output { writer: &mut output, name: "the output" }, progress)
}

/// [`translate_stream`] from the file `input` to the file `output`, `-` naming standard
/// input or output. The total for `progress` is counted beforehand when the input is a
/// regular file (standard input redirected from one too). A file output is written to a
/// temporary file beside it, renamed over it once everything is translated: a failed or
/// cancelled call leaves no partial output (an existing file keeps its contents; the new
/// one gets its permissions). Devices and FIFOs are written to directly; standard output
/// is written as chunks are translated, and a path naming an open descriptor
/// (`/dev/stdout`, `/dev/fd/N`, ...) reads or writes that descriptor where it is.
pub fn translate_file(
    translator: &Translator,
    input: &Path,
    output: &Path,
    options: &TranslateOptions,
    text_options: &TextOptions,
    stream: &StreamOptions,
    progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<usize> {
    // The options are checked before any file is opened or created.
    let streamer = Streamer::new(translator, options, text_options, stream)?;
    let stdin = io::stdin();
    let (mut reader, total): (LineReader<Box<dyn BufRead>>, _) = if is_standard(input) {
        (LineReader::new(Box::new(stdin.lock()), "standard input"), standard_input_lines())
    } else {
        let name = input.display().to_string();
        let file = open_descriptor(input).unwrap_or_else(|| File::open(input)).map_err(|e| Error::io(format!("cannot open {name}: {e}")))?;
        let total = file.metadata().is_ok_and(|m| m.is_file()).then(|| count_lines(&file)).flatten();
        (LineReader::new(Box::new(BufReader::with_capacity(IO_BUFFER, file)), name), total)
    };
    let streamer = Streamer { total_lines: streamer.total_lines.or(total), ..streamer };
    if is_standard(output) {
        let mut writer = BufWriter::with_capacity(IO_BUFFER, io::stdout().lock());
        return streamer.run(&mut reader, &mut Output { writer: &mut writer, name: "standard output" }, progress);
    }
    let mut file = OutputFile::create(output)?;
    let name = output.display().to_string();
    let lines = streamer.run(&mut reader, &mut Output { writer: &mut file.writer, name: &name }, progress)?;
    file.commit()?;
    Ok(lines)
}

fn is_standard(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A duplicate of the descriptor `path` names when it names one of the process's open
/// files (`/dev/stdin`, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`).
/// Opened by name, a redirected one would be a new file description at offset 0, and as
/// an output its file would be replaced by the rename (what the program wrote before,
/// lost); the duplicate reads and writes where the process is.
#[cfg(unix)]
fn open_descriptor(path: &Path) -> Option<io::Result<File>> {
    use std::os::fd::FromRawFd;
    let text = path.to_str()?;
    let fd: libc::c_int = match text {
        "/dev/stdin" => 0,
        "/dev/stdout" => 1,
        "/dev/stderr" => 2,
        _ => ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"].iter().find_map(|p| text.strip_prefix(p))?.parse().ok()?,
    };
    // SAFETY: fcntl only reads its integer arguments; a descriptor that is not open is EBADF.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Some(Err(io::Error::last_os_error()));
    }
    // SAFETY: `copy` is a new descriptor that nothing else owns.
    Some(Ok(unsafe { File::from_raw_fd(copy) }))
}

#[cfg(not(unix))]
fn open_descriptor(_path: &Path) -> Option<io::Result<File>> {
    None
}

/// What one streaming translation needs besides its input and output.
struct Streamer<'a> {
    translator: &'a Translator,
    options: TranslateOptions,
    text_options: TextOptions,
    tokens: bool,
    chunk_lines: usize,
    total_lines: Option<usize>,
}

impl<'a> Streamer<'a> {
    /// Checks the options before any input is read (a pipe may keep a bad option waiting).
    fn new(
        translator: &'a Translator,
        options: &TranslateOptions,
        text_options: &TextOptions,
        stream: &StreamOptions,
    ) -> Result<Streamer<'a>> {
        let mut options = options.clone();
        // As in text translation: batches of 32 rather than a whole chunk in one.
        if options.max_batch_size == 0 {
            options.max_batch_size = DEFAULT_TEXT_BATCH_SIZE;
            options.batch_type = BatchType::Examples;
        }
        let batch_lines = match options.batch_type {
            BatchType::Examples => options.max_batch_size,
            BatchType::Tokens => DEFAULT_TEXT_BATCH_SIZE,
        };
        let chunk_lines =
            if stream.read_batch_size > 0 { stream.read_batch_size } else { BATCHES_PER_CHUNK.saturating_mul(batch_lines) };
        let streamer = Streamer {
            translator,
            options,
            text_options: *text_options,
            tokens: stream.tokens,
            chunk_lines,
            total_lines: stream.total_lines,
        };
        // Nothing to translate: the submission checks everything (options, tokenizer).
        streamer.submit(if streamer.tokens { Sources::Tokens(Vec::new()) } else { Sources::Text(Vec::new()) }, 0)?;
        Ok(streamer)
    }

    /// Submits the chunk whose first line is `first_line`. A sampling seed is the call's, and
    /// each chunk is its own call: the chunk's seed is the seed mixed with a draw seeded by
    /// its first line, so that chunks do not repeat each other's draws (the draws then depend on where
    /// the chunks start, i.e. on `read_batch_size`, but not on the threads).
    fn submit(&self, sources: Sources, first_line: usize) -> Result<Pending> {
        let chunk_options;
        let mut options = &self.options;
        if let Some(seed) = self.options.sampling_seed.filter(|_| first_line > 0) {
            chunk_options = TranslateOptions { sampling_seed: Some(seed ^ Rng::new(first_line as u64).next_u64()), ..self.options.clone() };
            options = &chunk_options;
        }
        Ok(match sources {
            Sources::Text(texts) => Pending::Text(self.translator.submit_text(&texts, options, &self.text_options, TextHooks::default())?),
            Sources::Tokens(source) => Pending::Tokens(self.translator.submit_batch(source, None, options, BatchHooks::default())?),
        })
    }

    fn run<R: BufRead>(
        &self,
        input: &mut LineReader<R>,
        output: &mut Output,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<usize> {
        let mut progress = Reporter { callback: progress, last: None, refused: false };
        let mut in_flight = InFlight(VecDeque::with_capacity(CHUNKS_IN_FLIGHT));
        let mut written = 0;
        loop {
            if !input.eof {
                let first_line = input.lines;
                let sources = input.read_chunk(self.chunk_lines, self.tokens)?;
                if input.lines > first_line {
                    let pending = self.submit(sources, first_line)?;
                    in_flight.0.push_back(Chunk { first_line, lines: input.lines - first_line, pending });
                }
            }
            if in_flight.0.len() < CHUNKS_IN_FLIGHT && !input.eof {
                continue;
            }
            let Some(chunk) = in_flight.0.pop_front() else { break };
            let total = if input.eof { input.lines } else { self.total_lines.unwrap_or(0) };
            let translated = chunk.pending.wait(&mut |done, parts| {
                // Lines of the chunk done, in proportion to its sentences (exact with tokens).
                let lines = chunk.first_line + done * chunk.lines / parts.max(1);
                progress.report(lines, total)
            });
            let translated = translated.map_err(|e| progress.cancelled(e, written, total))?;
            output.write(&translated, self.options.return_scores)?;
            written += chunk.lines;
            if !progress.report(written, total) {
                return Err(progress.cancelled(Error::cancelled(""), written, total));
            }
        }
        Ok(written)
    }
}

/// The caller's progress callback, told each (done, total) once.
struct Reporter<'a> {
    callback: &'a mut dyn FnMut(usize, usize) -> bool,
    last: Option<(usize, usize)>,
    refused: bool,
}

impl Reporter<'_> {
    fn report(&mut self, done: usize, total: usize) -> bool {
        if self.last != Some((done, total)) {
            self.last = Some((done, total));
            self.refused = !(self.callback)(done, total);
        }
        !self.refused
    }

    /// A chunk's error, in lines rather than the chunk's sentences when the callback
    /// cancelled.
    fn cancelled(&self, error: Error, written: usize, total: usize) -> Error {
        if !self.refused {
            return error;
        }
        let of = if total > 0 { format!(" of {total}") } else { String::new() };
        Error::cancelled(format!("cancelled by the progress callback after {written}{of} lines were written"))
    }
}

/// The lines of one chunk, as submitted.
enum Sources {
    Text(Vec<String>),
    Tokens(Vec<Vec<String>>),
}

/// A submitted chunk's job.
enum Pending {
    Text(Job<Vec<TextTranslation>>),
    Tokens(Job<Vec<TranslationResult>>),
}

enum Translated {
    Text(Vec<TextTranslation>),
    Tokens(Vec<TranslationResult>),
}

impl Pending {
    fn wait(&self, progress: &mut dyn FnMut(usize, usize) -> bool) -> Result<Translated> {
        Ok(match self {
            Pending::Text(job) => Translated::Text(job.wait_blocking(progress)?),
            Pending::Tokens(job) => Translated::Tokens(job.wait_blocking(progress)?),
        })
    }

    /// Cancels the job: batches not started are skipped, running ones stop at their next step.
    fn stop(&self) {
        match self {
            Pending::Text(job) => job.cancel(),
            Pending::Tokens(job) => job.cancel(),
        }
    }

    /// Waits until the job has ended (none of its batches runs).
    fn join(&self) {
        let _ = match self {
            Pending::Text(job) => job.finished(),
            Pending::Tokens(job) => job.finished(),
        };
    }
}

struct Chunk {
    /// Lines before the chunk's first.
    first_line: usize,
    lines: usize,
    pending: Pending,
}

/// The chunks submitted and not yet written. Left behind by an error, they are cancelled
/// and waited for: once the call returns, nothing of it runs (a C caller's callbacks and
/// buffers may go away).
struct InFlight(VecDeque<Chunk>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.iter().for_each(|c| c.pending.stop());
        self.0.iter().for_each(|c| c.pending.join());
    }
}

/// Input lines, counted.
struct LineReader<R> {
    input: R,
    /// What the messages call the input.
    name: String,
    line: Vec<u8>,
    /// Lines read so far.
    lines: usize,
    eof: bool,
}

impl<R: BufRead> LineReader<R> {
    fn new(input: R, name: impl Into<String>) -> LineReader<R> {
        LineReader { input, name: name.into(), line: Vec::new(), lines: 0, eof: false }
    }

    /// The next line without its line break (`\n`, and one `\r` before it); `None` at the end.
    fn next_line(&mut self) -> Result<Option<&str>> {
        self.line.clear();
        let read = self.input.read_until(b'\n', &mut self.line);
        let read = read.map_err(|e| Error::io(format!("cannot read line {} of {}: {e}", self.lines + 1, self.name)))?;
        if read == 0 {
            self.eof = true;
            return Ok(None);
        }
        self.lines += 1;
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
        }
        let line = std::str::from_utf8(&self.line).map_err(|e| {
            Error::invalid_argument(format!(
                "line {} of {} is not valid UTF-8 (at byte {})",
                self.lines,
                self.name,
                e.valid_up_to()
            ))
        })?;
        Ok(Some(line))
    }

    /// Up to `max` lines: texts, or sentences of tokens split at spaces, tabs and `\r`.
    fn read_chunk(&mut self, max: usize, tokens: bool) -> Result<Sources> {
        let mut sources = if tokens { Sources::Tokens(Vec::new()) } else { Sources::Text(Vec::new()) };
        for _ in 0..max {
            let Some(line) = self.next_line()? else { break };
            match &mut sources {
                Sources::Text(texts) => texts.push(line.to_string()),
                Sources::Tokens(batch) => {
                    batch.push(line.split([' ', '\t', '\r']).filter(|t| !t.is_empty()).map(str::to_string).collect())
                }
            }
        }
        Ok(sources)
    }
}

/// Where translations are written, in the CLI's format: per text line, its translation
/// (`--scores`: the sentence scores, comma-separated, then ` ||| `); per token line, one
/// line per hypothesis (`--scores`: its score, then ` ||| `).
struct Output<'a> {
    writer: &'a mut dyn Write,
    name: &'a str,
}

impl Output<'_> {
    fn write(&mut self, translated: &Translated, scores: bool) -> Result<()> {
        self.write_lines(translated, scores)
            .and_then(|()| self.writer.flush())
            .map_err(|e| Error::io(format!("cannot write the translation to {}: {e}", self.name)))
    }

    fn write_lines(&mut self, translated: &Translated, scores: bool) -> io::Result<()> {
        let w = &mut self.writer;
        match translated {
            Translated::Text(texts) => {
                for text in texts {
                    if scores {
                        for (i, sentence) in text.sentences.iter().enumerate() {
                            let separator = if i > 0 { "," } else { "" };
                            write!(w, "{separator}{:.6}", sentence.score.unwrap_or(f32::NAN))?;
                        }
                        w.write_all(b" ||| ")?;
                    }
                    w.write_all(text.text.as_bytes())?;
                    w.write_all(b"\n")?;
                }
            }
            Translated::Tokens(results) => {
                for result in results {
                    for (h, tokens) in result.hypotheses.iter().enumerate() {
                        if scores {
                            write!(w, "{:.6} ||| ", result.scores.get(h).copied().unwrap_or(f32::NAN))?;
                        }
                        w.write_all(tokens.join(" ").as_bytes())?;
                        w.write_all(b"\n")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Lines of a regular file from its current offset, or `None` (not a regular file, or
/// unreadable): counting reads it once more, without moving its offset.
#[cfg(unix)]
fn count_lines(file: &File) -> Option<usize> {
    use std::io::Seek;
    use std::os::unix::fs::FileExt;
    let mut at = (&*file).stream_position().ok()?;
    let mut buffer = vec![0u8; 1 << 20];
    let (mut lines, mut last) = (0, b'\n');
    loop {
        let n = match file.read_at(&mut buffer, at) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        lines += buffer[..n].iter().filter(|&&b| b == b'\n').count();
        last = buffer[n - 1];
        at += n as u64;
    }
    Some(lines + usize::from(last != b'\n'))
}

#[cfg(not(unix))]
fn count_lines(_file: &File) -> Option<usize> {
    None
}

/// Lines left in standard input when it is a regular file (`< file`).
#[cfg(unix)]
fn standard_input_lines() -> Option<usize> {
    use std::os::fd::AsFd;
    // A duplicate shares the offset, which counting does not move.
    let file = File::from(io::stdin().as_fd().try_clone_to_owned().ok()?);
    file.metadata().ok()?.is_file().then(|| count_lines(&file)).flatten()
}

#[cfg(not(unix))]
fn standard_input_lines() -> Option<usize> {
    None
}

/// A file output: a temporary file beside the destination, renamed over it by `commit`
/// and removed if dropped before. Devices and FIFOs are written to directly.
struct OutputFile {
    writer: BufWriter<File>,
    destination: PathBuf,
    /// The temporary file, until committed.
    temporary: Option<PathBuf>,
}

impl OutputFile {
    fn create(path: &Path) -> Result<OutputFile> {
        let name = path.display();
        if let Some(file) = open_descriptor(path) {
            let file = file.map_err(|e| Error::io(format!("cannot open {name}: {e}")))?;
            return Ok(OutputFile { writer: BufWriter::with_capacity(IO_BUFFER, file), destination: path.to_path_buf(), temporary: None });
        }
        // A symbolic link stays one: its target gets the translation.
        let destination = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let existing = fs::metadata(&destination).ok();
        if existing.as_ref().is_some_and(|m| !m.is_file()) {
            let file = File::create(&destination).map_err(|e| Error::io(format!("cannot open {name}: {e}")))?;
            return Ok(OutputFile { writer: BufWriter::with_capacity(IO_BUFFER, file), destination, temporary: None });
        }
        let file_name = destination
            .file_name()
            .ok_or_else(|| Error::invalid_argument(format!("the output {name} is not a file name")))?
            .to_string_lossy();
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let unique = format!(".{file_name}.tolk-{}-{}.tmp", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed));
        let temporary = destination.with_file_name(unique);
        let file = File::options().write(true).create_new(true).open(&temporary).map_err(|e| {
            Error::io(format!("cannot create the output {name} (written as {} until complete): {e}", temporary.display()))
        })?;
        let output = OutputFile { writer: BufWriter::with_capacity(IO_BUFFER, file), destination, temporary: Some(temporary) };
        if let Some(existing) = existing {
            let _ = output.writer.get_ref().set_permissions(existing.permissions());
        }
        Ok(output)
    }

    /// Puts the complete translation in place (on disk first, then renamed).
    fn commit(mut self) -> Result<()> {
        let name = self.destination.display().to_string();
        let failed = |e: io::Error| Error::io(format!("cannot write the translation to {name}: {e}"));
        self.writer.flush().map_err(failed)?;
        let Some(temporary) = &self.temporary else { return Ok(()) };
        self.writer.get_ref().sync_all().map_err(failed)?;
        fs::rename(temporary, &self.destination).map_err(failed)?;
        self.temporary = None;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let Some(temporary) = self.temporary.take() {
            let _ = fs::remove_file(temporary);
        }
    }
}
