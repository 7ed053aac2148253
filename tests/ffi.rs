//! The C side of the library, tested from C: compiles every `ffi-tests/*.c` and the
//! examples `examples-c/tolk-translate.c` and `examples-c/desktop.c` against `include/tolk.h`
//! and the `libtolk.so` that `cargo build --release` wrote, runs them on the committed
//! CTranslate2 fixture `ffi-tests/fixtures/tiny` (`marian_test.c` also on the en-pt
//! Bergamot package, when TOLK_MODELS has it), and again under valgrind when it is on PATH
//! (no invalid accesses, no definite or indirect leaks; the programs see
//! `TOLK_FFI_VALGRIND=1` there and may shrink their biggest inputs).
//!
//! `cargo test` does not relink libtolk.so: build it first (scripts/test.sh does). The
//! tests refuse a library older than the sources rather than test stale code.
//! Environment: CC (C compiler, default cc/gcc/clang), CARGO_TARGET_DIR, TOLK_LIB_DIR
//! (test another build of the library), TOLK_MODELS (where the zh-en and en-pt-bergamot
//! models are, for the tests that also run them; default models/, else ../shared/models).
//!
//! The fixture's `sentencepiece.model` (the tokenizer of the text API tests; 80 pieces,
//! unigram, identity normalization so that it stays under 1 KB, every token of the fixture's
//! vocabulary among its pieces) was trained with python `sentencepiece` 0.2.x, from the
//! repository root:
//!
//! ```text
//! python3 - <<'EOF'
//! import sentencepiece as spm
//! lines = """Hello world. How are you?
//! A quick brown fox jumps over the lazy dog.
//! The cat sat on the mat, and the dog sat on the log!
//! We love to read and write small texts.
//! Zebra quilt vex jinx kept my box.
//! Pack my box with five dozen liquor jugs.
//! She sells sea shells by the sea shore.
//! This is a test of the tiny model.
//! Un café à l'école en été: élan, élève, étoile, écho, état.
//! Hello again world; hello, hello.
//! Say é and é again, é is a letter: é.""".splitlines()
//! with open("ffi-tests/fixtures/tiny/sentencepiece.model", "wb") as f:
//!     spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=f, model_type="unigram",
//!         vocab_size=80, character_coverage=1.0, normalization_rule_name="identity", minloglevel=2)
//! EOF
//! ```
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::SystemTime;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest_dir().join(dir), // relative: to the package root, where cargo runs
        None => manifest_dir().join("target"),
    }
}

fn fixture() -> PathBuf {
    manifest_dir().join("ffi-tests/fixtures/tiny")
}

/// Newest modification time of the files under `path` (the path itself if a file).
fn newest_mtime(path: &Path) -> SystemTime {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if !meta.is_dir() {
        return meta.modified().unwrap();
    }
    std::fs::read_dir(path).unwrap().map(|e| newest_mtime(&e.unwrap().path())).max().unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The folder holding the libtolk.so under test: target/<profile> unless TOLK_LIB_DIR says.
fn lib_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOLK_LIB_DIR") {
        return PathBuf::from(dir);
    }
    let dir = target_dir().join(if cfg!(debug_assertions) { "debug" } else { "release" });
    let lib = dir.join("libtolk.so");
    let flag = if cfg!(debug_assertions) { "" } else { " --release" };
    assert!(lib.is_file(), "{} is missing: build the library first (cargo build{flag})", lib.display());
    let built = newest_mtime(&lib);
    for source in ["src", "build.rs", "Cargo.toml"] {
        assert!(
            newest_mtime(&manifest_dir().join(source)) <= built,
            "{} is older than {source}: rebuild it (cargo build{flag}) so that the C tests test the current code",
            lib.display()
        );
    }
    dir
}

/// Where the C programs are built; it also holds the libtolk.so.0 link they load.
fn out_dir() -> PathBuf {
    let dir = target_dir().join("ffi-tests");
    std::fs::create_dir_all(&dir).unwrap();
    // The SONAME is libtolk.so.0 but cargo writes only libtolk.so: give the loader that
    // name next to the binaries (they have an rpath to this folder). Tests run in
    // parallel, so the link is replaced atomically (rename): a program started by another
    // test never sees it missing.
    let tmp = dir.join(format!("libtolk.so.0.{:?}.tmp", std::thread::current().id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(lib_dir().join("libtolk.so"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("libtolk.so.0")).unwrap();
    dir
}

/// $CC, else the first of cc, gcc, clang that runs.
fn c_compiler() -> String {
    if let Ok(cc) = std::env::var("CC") {
        return cc;
    }
    ["cc", "gcc", "clang"]
        .into_iter()
        .find(|cc| Command::new(cc).arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()))
        .expect("no C compiler found (set CC, or install cc, gcc or clang)")
        .to_string()
}

/// Compiles one C program against the header and the shared library; returns the binary.
fn compile(source: &Path) -> PathBuf {
    let out = out_dir();
    let binary = out.join(source.file_stem().unwrap());
    let cc = c_compiler();
    let output = Command::new(&cc)
        .args(["-std=c99", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(manifest_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&binary)
        .arg("-L")
        .arg(lib_dir())
        .args(["-ltolk", "-lm"])
        .arg(format!("-Wl,-rpath,{}", out.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(
        output.status.success(),
        "compiling {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// Runs `cmd` with `stdin` as its input; a thread feeds it so that large outputs cannot
/// deadlock the pipes.
fn run(mut cmd: Command, stdin: impl AsRef<[u8]>) -> Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Tests run in parallel: a binary another thread just wrote can be briefly "busy"
    // (ETXTBSY) while a concurrent fork still holds its file open.
    let mut attempts = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
        }
    };
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.as_ref().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input); // the program may exit without reading
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn valgrind_available() -> bool {
    Command::new("valgrind").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs the program under valgrind's memcheck and asserts it is clean and succeeds.
fn run_under_valgrind(binary: &Path, args: &[&str], stdin: &str) {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect"])
        .args(["--show-leak-kinds=definite,indirect", "--error-exitcode=99"])
        .arg(format!("--suppressions={}", manifest_dir().join("ffi-tests/valgrind.supp").display()))
        .arg(binary)
        .args(args)
        .env("TOLK_FFI_VALGRIND", "1");
    let out = run(cmd, stdin);
    assert!(
        out.status.success(),
        "valgrind: {} {args:?} exited with {}:\n{}",
        binary.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The C tests that need more than the fixture: each has its own test below.
const C_TESTS_RUN_APART: [&str; 2] = ["marian_test.c", "memory_test.c"];

#[test]
fn c_api_tests_pass_and_run_clean_under_valgrind() {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(manifest_dir().join("ffi-tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .filter(|p| !C_TESTS_RUN_APART.iter().any(|apart| p.file_name().is_some_and(|n| n == *apart)))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C tests in ffi-tests/");
    let model = fixture();
    let model = model.to_str().unwrap();
    let binaries: Vec<PathBuf> = sources.iter().map(|s| compile(s)).collect();
    let valgrind = valgrind_available();
    if !valgrind {
        eprintln!("valgrind is not installed: the C tests run without the memory check");
    }
    // The programs (and their valgrind runs, which are slow) run in parallel.
    std::thread::scope(|scope| {
        for binary in &binaries {
            scope.spawn(move || {
                let mut cmd = Command::new(binary);
                cmd.arg(model);
                let out = run(cmd, "");
                assert!(
                    out.status.success(),
                    "{} failed:\n{}{}",
                    binary.display(),
                    text(&out.stdout),
                    text(&out.stderr)
                );
                if valgrind {
                    run_under_valgrind(binary, &[model], "");
                }
            });
        }
    });
}

/// The expected hypotheses of run `index` of expected.json as CLI output lines
/// ("score ||| tokens"). make_tiny.py writes one hypothesis object per JSON array line,
/// `{"tokens": [...], "score": x}`, which is all this reads (no JSON parser in std).
fn expected_cli_lines(index: usize) -> Vec<(f64, String)> {
    let json = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    let run = json.split("{\"options\"").nth(index + 1).expect("expected.json has that run");
    let results = &run[run.find("\"results\"").unwrap()..];
    results
        .split("{\"tokens\": [")
        .skip(1)
        .map(|hyp| {
            let (tokens, rest) = hyp.split_once("], \"score\": ").unwrap();
            let score = rest[..rest.find('}').unwrap()].parse().unwrap();
            let tokens: Vec<&str> = tokens.split(", ").filter(|t| !t.is_empty()).map(|t| t.trim_matches('"')).collect();
            (score, tokens.join(" "))
        })
        .collect()
}

/// Splits CLI lines "score ||| tokens".
fn parse_cli_lines(stdout: &str) -> Vec<(f64, String)> {
    stdout
        .lines()
        .map(|l| {
            let (score, tokens) = l.split_once(" ||| ").unwrap_or_else(|| panic!("no score in {l:?}"));
            (score.parse().unwrap(), tokens.to_string())
        })
        .collect()
}

/// The C examples, built once per test process (tests run in parallel and must not run
/// two makes into one folder).
struct Examples {
    cli: PathBuf,
    desktop: PathBuf,
}

/// Builds the examples with their Makefile (make is part of what is tested), or directly
/// without make.
fn examples() -> &'static Examples {
    static BUILT: std::sync::OnceLock<Examples> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let has_make = Command::new("make").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
        if !has_make {
            eprintln!("make is not installed: compiling the examples-c programs directly");
            return Examples {
                cli: compile(&manifest_dir().join("examples-c/tolk-translate.c")),
                desktop: compile(&manifest_dir().join("examples-c/desktop.c")),
            };
        }
        let build = out_dir().join("examples-c");
        let out = Command::new("make")
            .arg("-C")
            .arg(manifest_dir().join("examples-c"))
            .arg(format!("BUILD={}", build.display()))
            .arg(format!("TOLK_LIB_DIR={}", lib_dir().display()))
            .arg(format!("CC={}", c_compiler()))
            .output()
            .unwrap();
        assert!(out.status.success(), "make -C examples-c failed:\n{}{}", text(&out.stdout), text(&out.stderr));
        Examples { cli: build.join("tolk-translate"), desktop: build.join("desktop") }
    })
}

/// The path of the CLI, built.
fn build_cli() -> PathBuf {
    examples().cli.clone()
}

/// Runs `binary` with `args` and `stdin`: (exit code, stdout, stderr).
fn run_program(binary: &Path, args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    let out = run(cmd, stdin);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A temporary copy of the fixture's model without its tokenizer: DIR/model, where neither
/// DIR/model nor DIR (also searched) has a SentencePiece model.
fn fixture_without_tokenizer(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("tolk-ffi-{name}-{}", std::process::id()));
    let dir = root.join("model");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["model.bin", "config.json", "shared_vocabulary.json"] {
        std::fs::copy(fixture().join(file), dir.join(file)).unwrap();
    }
    dir
}

#[test]
fn the_c_example_translates_lines_and_reports_errors() {
    let binary = build_cli();
    let model = fixture();
    let model = model.to_str().unwrap();
    let cli = |args: &[&str], stdin: &str| {
        let mut cmd = Command::new(&binary);
        cmd.args(args);
        let out = run(cmd, stdin);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    // The sources of expected.json, the last line empty.
    let input = "a b c\nh e l l o w o r l d\nz\n▁é q x\nm not-in-vocab n\n\n";

    // Greedy and beam 2 with 2 hypotheses per line, compared with CTranslate2's output.
    for (run_index, beam, n_best) in [(0, "1", "1"), (1, "2", "2")] {
        let args = [
            "--model",
            model,
            "--tokens",
            "--beam",
            beam,
            "--n-best",
            n_best,
            "--scores",
            "--max-decoding-length",
            "24",
        ];
        let (code, stdout, stderr) = cli(&args, input);
        assert_eq!(code, Some(0), "{stderr}");
        let got = parse_cli_lines(&stdout);
        let want = expected_cli_lines(run_index);
        assert_eq!(got.len(), 6 * n_best.parse::<usize>().unwrap(), "{n_best} line(s) per input line:\n{stdout}");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(g.1 == w.1 && (g.0 - w.0).abs() < 1e-4, "beam {beam}: got {g:?}, CTranslate2 {w:?}\n{stdout}");
        }
        // The library's internal batching and threads do not change the output.
        for extra in [
            &["--max-batch-size", "1"][..],
            &["--batch-type", "tokens", "--max-batch-size", "7"],
            &["--intra-threads", "2"],
            &["--max-batch-size", "2", "--max-decoding-memory-mb", "1"],
        ] {
            let (code, again, stderr) = cli(&[&args[..], extra].concat(), input);
            assert_eq!(code, Some(0), "{extra:?}: {stderr}");
            assert_eq!(again, stdout, "{extra:?} changed the output");
        }
    }

    // Without --scores: tokens only; a last line without a newline still counts; no input,
    // no output; a line of 3000 tokens (no fixed-size buffers).
    let greedy = expected_cli_lines(0);
    let (code, stdout, _) =
        cli(&["--model", model, "--tokens", "--beam", "1", "--max-decoding-length", "24"], "a b c\nz");
    assert_eq!((code, stdout), (Some(0), format!("{}\n{}\n", greedy[0].1, greedy[2].1)));
    let (code, stdout, _) = cli(&["--model", model, "--tokens"], "");
    assert_eq!((code, stdout.as_str()), (Some(0), ""));
    // Compact keys/values: a translation of each line, close to float32's.
    for kv in ["bfloat16", "int8"] {
        let (code, stdout, stderr) =
            cli(&["--model", model, "--tokens", "--beam", "1", "--max-decoding-length", "24", "--kv-cache-type", kv], "a b c\nz");
        assert_eq!(code, Some(0), "{kv}: {stderr}");
        assert_eq!(stdout.lines().count(), 2, "{kv}: {stdout}");
    }
    // Random sampling: the same seed draws the same tokens; the default (top-k 1) and a
    // temperature of 0 are greedy search; each chunk of the input draws its own tokens.
    let sample = |extra: &[&str], stdin: &str| {
        let args = [&["--model", model, "--tokens", "--beam", "1", "--max-decoding-length", "24"][..], extra].concat();
        let (code, stdout, stderr) = cli(&args, stdin);
        assert_eq!(code, Some(0), "{extra:?}: {stderr}");
        stdout
    };
    let greedy_lines = format!("{}\n{}\n", greedy[0].1, greedy[2].1);
    assert_eq!(sample(&["--sampling-topk", "1", "--sampling-seed", "7"], "a b c\nz\n"), greedy_lines);
    assert_eq!(sample(&["--sampling-topk", "0", "--sampling-temperature", "0"], "a b c\nz\n"), greedy_lines);
    let drawn = sample(&["--sampling-topk", "0", "--sampling-seed", "7"], input);
    assert_eq!(drawn.lines().count(), 6, "{drawn}");
    assert_eq!(sample(&["--sampling-topk", "0", "--sampling-seed", "7"], input), drawn, "the same seed, other draws");
    assert_eq!(sample(&["--sampling-topk", "0", "--sampling-seed", "7", "--intra-threads", "2"], input), drawn);
    assert_ne!(sample(&["--sampling-topk", "0", "--sampling-seed", "8"], input), drawn, "another seed, the same draws");
    // Without --beam, sampling implies greedy search (the CLI's default beam is 2).
    let (code, unbeamed, stderr) = cli(&["--model", model, "--tokens", "--max-decoding-length", "24", "--sampling-topk", "0", "--sampling-seed", "7"], input);
    assert_eq!((code, unbeamed), (Some(0), drawn.clone()), "{stderr}");
    let same_lines = "a b c\n".repeat(4);
    let chunked = sample(&["--sampling-topk", "0", "--sampling-topp", "0.95", "--sampling-seed", "7", "--read-batch-size", "1"], &same_lines);
    let chunk_lines: Vec<&str> = chunked.lines().collect();
    assert_eq!(chunk_lines.len(), 4, "{chunked}");
    assert!(chunk_lines.iter().any(|l| *l != chunk_lines[0]), "every chunk drew the same tokens: {chunked}");
    let long_line = format!("{}\nz\n", vec!["h e l l o"; 600].join(" "));
    let (code, stdout, stderr) = cli(&["--model", model, "--tokens", "--max-decoding-length", "3"], &long_line);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 2);

    // --help succeeds on stdout.
    let (code, stdout, _) = cli(&["--help"], "");
    assert!(code == Some(0) && stdout.starts_with("usage:"), "{stdout}");

    // Bad usage: exit 2 and a message naming the problem.
    let usage_errors: &[(&[&str], &str)] = &[
        (&[], "--model"),
        (&["--model", model, "--n-best", "2"], "--n-best"), // text mode: one translation per line
        (&["--model", model, "--split", "words"], "--split"),
        (&["--model", model, "--max-sentence-tokens", "x"], "--max-sentence-tokens"),
        (&["--model", model, "--tokens", "--beam", "x"], "--beam"),
        (&["--model", model, "--tokens", "--beam", "-1"], "--beam"),
        (&["--model", model, "--tokens", "--n-best", "99999999999"], "--n-best"),
        (&["--model", model, "--tokens", "--beam"], "--beam"),
        (&["--model", model, "--tokens", "--bogus", "1"], "--bogus"),
        (&["--model", model, "--tokens", "--batch-type", "lines"], "--batch-type"),
        (&["--model", model, "--tokens", "--length-penalty", "long"], "--length-penalty"),
        (&["--model", model, "--tokens", "--sampling-seed", "-3"], "--sampling-seed"),
        (&["--model", model, "--tokens", "--sampling-topp", "most"], "--sampling-topp"),
        (&["--model", model, "--tokens", "--sampling-topk", "x"], "--sampling-topk"),
    ];
    for (args, needle) in usage_errors {
        let (code, stdout, stderr) = cli(args, "a\n");
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle) && stdout.is_empty(), "{args:?}: stderr {stderr:?} should name {needle}");
    }
    // Errors from the library: exit 1 and tolk_last_error()'s message.
    let library_errors: &[(&[&str], &str)] = &[
        (&["--model", "/nonexistent/model", "--tokens"], "/nonexistent/model"),
        (&["--model", model, "--tokens", "--beam", "0"], "beam"),
        (&["--model", model, "--tokens", "--beam", "2", "--n-best", "3"], "hypotheses"),
        (&["--model", model, "--tokens", "--compute-type", "int3"], "int3"),
        (&["--model", model, "--tokens", "--kv-cache-type", "float8"], "kv_cache_type"),
        (&["--model", model, "--tokens", "--max-decoding-length", "0"], "decoding length"),
        (&["--model", model, "--tokens", "--beam", "2", "--sampling-topk", "5"], "sampling"),
    ];
    for (args, needle) in library_errors {
        let (code, stdout, stderr) = cli(args, "a\n");
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle) && stdout.is_empty(), "{args:?}: stderr {stderr:?} should contain {needle:?}");
    }

    if valgrind_available() {
        let args = ["--model", model, "--tokens", "--beam", "3", "--n-best", "2", "--scores"];
        run_under_valgrind(&binary, &args, input);
        // Error paths free what they allocated too.
        let mut cmd = Command::new("valgrind");
        cmd.args(["--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99"])
            .arg(&binary)
            .args(["--model", model, "--tokens", "--beam", "0"]);
        let out = run(cmd, input);
        assert_eq!(out.status.code(), Some(1), "valgrind found errors on an error path:\n{}", text(&out.stderr));
    }
}

/// Splits text-mode `--scores` lines "s1,s2,... ||| text" into the sentence scores and text.
fn parse_text_score_lines(stdout: &str) -> Vec<(Vec<f64>, String)> {
    stdout
        .split_terminator('\n')
        .map(|l| {
            let (scores, text) = l.split_once(" ||| ").unwrap_or_else(|| panic!("no \" ||| \" in {l:?}"));
            let scores = if scores.is_empty() {
                vec![]
            } else {
                scores.split(',').map(|s| s.parse().unwrap_or_else(|e| panic!("score {s:?} in {l:?}: {e}"))).collect()
            };
            (scores, text.to_string())
        })
        .collect()
}

/// Text mode, the CLI's default: one output line per input line (a last line without a
/// newline included), empty and blank lines back as they were, sentences translated one by
/// one (--scores: one score per sentence), --split lines, wrapping, the tokenizer options, and
/// their errors. Only the line break ends a line: a lone "\r" or a NUL byte inside a line is
/// text the library gets.
#[test]
fn the_c_example_translates_text_lines() {
    let binary = build_cli();
    let model = fixture();
    let model = model.to_str().unwrap();
    let cli = |args: &[&str], stdin: &str| run_program(&binary, args, stdin);
    let input = "Hello world. How are you?\nThe cat sat on the mat.\n\n   \nZebra quilt vex jinx. We love to read. Say é again!\nz";
    let quick = ["--model", model, "--max-decoding-length", "24"];

    let (code, stdout, stderr) = cli(&quick, input);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.split_terminator('\n').collect();
    assert!(stdout.ends_with('\n'), "{stdout:?}");
    assert_eq!(lines.len(), 6, "one line per input line:\n{stdout}");
    assert_eq!((lines[2], lines[3]), ("", "   "), "empty and blank lines stay as they were");
    for i in [0, 1, 4, 5] {
        let line = lines[i];
        assert!(!line.is_empty() && line.trim() == line && !line.contains('\u{2581}'), "line {i}: {line:?}");
    }
    // Each line is translated on its own.
    let (code, alone, _) = cli(&quick, "The cat sat on the mat.\n");
    assert_eq!((code, alone), (Some(0), format!("{}\n", lines[1])));
    // Batching and threads do not change the output.
    for extra in [
        &["--max-batch-size", "1"][..],
        &["--batch-type", "tokens", "--max-batch-size", "7"],
        &["--intra-threads", "2"],
    ] {
        let (code, again, stderr) = cli(&[&quick[..], extra].concat(), input);
        assert_eq!(code, Some(0), "{extra:?}: {stderr}");
        assert_eq!(again, stdout, "{extra:?} changed the output");
    }

    // --scores: "s1,s2 ||| text", one finite score <= 0 per sentence, the same texts.
    let (code, scored, stderr) = cli(&[&quick[..], &["--scores"]].concat(), input);
    assert_eq!(code, Some(0), "{stderr}");
    let scored = parse_text_score_lines(&scored);
    let counts: Vec<usize> = scored.iter().map(|(s, _)| s.len()).collect();
    assert_eq!(counts, [2, 1, 0, 0, 3, 1], "sentences per line: {scored:?}");
    assert!(scored.iter().flat_map(|(s, _)| s).all(|s| s.is_finite() && *s <= 0.0), "{scored:?}");
    let texts: Vec<&str> = scored.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, lines, "--scores changed the translations");

    // --split lines: every non-blank line is one sentence; lines of one sentence are
    // translated as before. "line" is the same mode.
    let (code, by_line_out, stderr) = cli(&[&quick[..], &["--split", "lines", "--scores"]].concat(), input);
    assert_eq!(code, Some(0), "{stderr}");
    let by_line = parse_text_score_lines(&by_line_out);
    let counts: Vec<usize> = by_line.iter().map(|(s, _)| s.len()).collect();
    assert_eq!(counts, [1, 1, 0, 0, 1, 1], "--split lines: {by_line:?}");
    assert_eq!((by_line[1].1.as_str(), by_line[5].1.as_str()), (lines[1], lines[5]));
    let (code, alias, stderr) = cli(&[&quick[..], &["--split", "line", "--scores"]].concat(), input);
    assert_eq!((code, alias), (Some(0), by_line_out), "--split line is --split lines: {stderr}");
    let (code, help, _) = cli(&["--help"], "");
    assert!(code == Some(0) && help.contains("sentences|lines"), "{help}");
    let (code, explicit, _) = cli(&[&quick[..], &["--split", "sentences"]].concat(), input);
    assert_eq!((code, explicit), (Some(0), stdout.clone()), "--split sentences is the default");

    // --max-sentence-tokens: long sentences are wrapped into more parts.
    let (code, wrapped, stderr) = cli(&[&quick[..], &["--max-sentence-tokens", "4", "--scores"]].concat(), input);
    assert_eq!(code, Some(0), "{stderr}");
    let wrapped = parse_text_score_lines(&wrapped);
    assert!(wrapped[1].0.len() >= 3, "a sentence of ~10 tokens cut at 4: {wrapped:?}");
    // The tiny model adds no end token to its sources: 1 is one piece per part ("Hello
    // world." is 4 pieces). (zh-en, which adds one, refuses 1: see the zh-en test.)
    let (code, out, stderr) = cli(&[&quick[..], &["--max-sentence-tokens", "1", "--scores"]].concat(), "Hello world.\n");
    assert_eq!(code, Some(0), "{stderr}");
    let out = parse_text_score_lines(&out);
    assert_eq!(out[0].0.len(), 4, "{out:?}");

    // No input, no output.
    let (code, out, _) = cli(&quick, "");
    assert_eq!((code, out.as_str()), (Some(0), ""));

    // Only "\n" (and one "\r" before it) ends a line. A lone "\r" inside a line is a line
    // break for the library: both sentences are translated and the "\r" stays between them
    // (the CLI used to cut the line there). CRLF lines lose their "\r" like "\n"; a
    // second "\r" is part of the line.
    let scored_lines = |stdin: &str| {
        let (code, out, stderr) = cli(&[&quick[..], &["--scores"]].concat(), stdin);
        assert_eq!(code, Some(0), "{stdin:?}: {stderr}");
        parse_text_score_lines(&out)
    };
    let (code, hello, _) = cli(&quick, "Hello world.\n");
    let hello = hello.trim_end_matches('\n').to_string();
    let (code2, how, _) = cli(&quick, "How are you?\n");
    let how = how.trim_end_matches('\n').to_string();
    assert_eq!((code, code2), (Some(0), Some(0)));
    let got = scored_lines("Hello world.\rHow are you?\nZebra.\r\n");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0.len(), 2, "both sides of the \\r are translated: {got:?}");
    assert_eq!(got[0].1, format!("{hello}\r{how}"), "the \\r stays between the translations");
    assert!(got[1].0.len() == 1 && !got[1].1.contains('\r'), "CRLF: {got:?}");
    let got = scored_lines("Hello world.\r\r\n");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, format!("{hello}\r"), "only one \\r goes with the line break");
    let (code, out, stderr) = cli(&[&quick[..], &["--split", "lines", "--scores"]].concat(), "Hello world.\rHow are you?\n");
    assert_eq!(code, Some(0), "{stderr}");
    let got = parse_text_score_lines(&out);
    assert!(got.len() == 1 && got[0].0.len() == 2, "--split lines: the \\r ends a line there too: {got:?}");
    // A NUL byte is text: lines go to the library with their lengths. The first sentence
    // runs on past the NUL (no space after the "."), so the line has two sentences where
    // the line cut at the NUL would have one.
    let nul = "Zebra quilt.\0 Hello world. How are you?\nWe love to read.\n";
    let got = scored_lines(nul);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0.len(), 2, "the text after the NUL is translated: {got:?}");
    let (code, cut, _) = cli(&[&quick[..], &["--scores"]].concat(), "Zebra quilt.\nWe love to read.\n");
    assert_eq!(code, Some(0));
    assert_ne!(got[0].1, parse_text_score_lines(&cut)[0].1, "the line was cut at the NUL");
    assert_eq!(got[1].1, parse_text_score_lines(&cut)[1].1);
    // Invalid UTF-8 is the library's error.
    let out = run(
        {
            let mut cmd = Command::new(&binary);
            cmd.args(quick);
            cmd
        },
        b"fine\n\xff\xfe\n".as_slice(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("UTF-8") && out.stdout.is_empty(), "{}", text(&out.stderr));

    // Tokenizers: a model without one fails in text mode (tokens still work), a named one
    // replaces the package's, a missing one is an error naming it.
    let bare = fixture_without_tokenizer("cli");
    let bare = bare.to_str().unwrap();
    let spm = fixture().join("sentencepiece.model");
    let spm = spm.to_str().unwrap();
    let (code, out, stderr) = cli(&["--model", bare], "Hello world.\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("SentencePiece") && out.is_empty(), "{stderr}");
    let (code, _, stderr) = cli(&["--model", bare, "--tokens"], "a b c\n");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, out, stderr) = cli(&["--model", bare, "--source-spm", spm, "--max-decoding-length", "24"], input);
    assert_eq!((code, out), (Some(0), stdout.clone()), "--source-spm: {stderr}");
    let (code, out, stderr) = cli(&[&quick[..], &["--source-spm", spm, "--target-spm", spm]].concat(), input);
    assert_eq!((code, out), (Some(0), stdout.clone()), "--target-spm: {stderr}");
    for args in [
        &["--model", model, "--source-spm", "/nonexistent/source.spm"][..],
        &["--model", model, "--target-spm", "/nonexistent/source.spm"],
    ] {
        let (code, out, stderr) = cli(args, "Hello.\n");
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("/nonexistent/source.spm") && out.is_empty(), "{args:?}: {stderr}");
    }

    if valgrind_available() {
        run_under_valgrind(&binary, &[&quick[..], &["--scores", "--beam", "3"]].concat(), input);
        // The error path of a package without a tokenizer frees what it allocated too.
        let mut cmd = Command::new("valgrind");
        cmd.args(["--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99"])
            .arg(&binary)
            .args(["--model", bare]);
        let out = run(cmd, input);
        assert_eq!(out.status.code(), Some(1), "valgrind found errors on an error path:\n{}", text(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(Path::new(bare).parent().unwrap());
}

/// The "DONE/TOTAL" lines `--progress` writes to stderr, checked: non-decreasing, one
/// total, the last one complete.
fn progress_lines(stderr: &str) -> Vec<(usize, usize)> {
    let lines: Vec<(usize, usize)> = stderr
        .lines()
        .filter_map(|l| {
            let (done, total) = l.split_once('/')?;
            Some((done.parse().ok()?, total.parse().ok()?))
        })
        .collect();
    for pair in lines.windows(2) {
        assert!(pair[0].0 <= pair[1].0 && pair[0].1 == pair[1].1, "progress out of order: {lines:?}");
    }
    if let Some(&(done, total)) = lines.last() {
        assert_eq!(done, total, "the last progress line is not complete: {lines:?}");
    }
    lines
}

/// tolk-translate --progress: "DONE/TOTAL" input lines on stderr (not a terminal) after each
/// batch and chunk; in text mode the lines done inside a chunk are estimated from its
/// translated parts (sentences, and parts of wrapped ones). The output is the same as
/// without it, and no input means no line.
#[test]
fn the_c_example_reports_progress() {
    let binary = build_cli();
    let model = fixture();
    let model = model.to_str().unwrap();
    let cli = |args: &[&str], stdin: &str| run_program(&binary, args, stdin);

    // Token mode: 7 lines (one empty), batches of 3: 3, 6, 7.
    let tokens = "a b c\nh e l l o\nz\n\nm n\nq r s t\nx\n";
    let base = ["--model", model, "--tokens", "--beam", "1", "--max-decoding-length", "16", "--max-batch-size", "3"];
    let (code, plain, stderr) = cli(&base, tokens);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(progress_lines(&stderr).is_empty(), "no --progress, no progress: {stderr}");
    let (code, out, stderr) = cli(&[&base[..], &["--progress"]].concat(), tokens);
    assert_eq!((code, out.as_str()), (Some(0), plain.as_str()), "{stderr}");
    // Batches of 3, 3 and 1 sentences, counted as they finish: a later batch joins the
    // decoding of an earlier one (continuous batching) and may finish first.
    let orders: [&[(usize, usize)]; 3] = [&[(3, 7), (6, 7), (7, 7)], &[(3, 7), (4, 7), (7, 7)], &[(1, 7), (4, 7), (7, 7)]];
    assert!(orders.contains(&progress_lines(&stderr).as_slice()), "{stderr}");
    // Batches of tokens: done grows by whole sentences up to 7.
    let (code, _, stderr) = cli(&[&base[..], &["--progress", "--batch-type", "tokens"]].concat(), tokens);
    assert_eq!(code, Some(0), "{stderr}");
    let lines = progress_lines(&stderr);
    assert!(lines.len() >= 2 && lines.last() == Some(&(7, 7)), "{stderr}");
    let (code, out, stderr) = cli(&[&base[..], &["--progress"]].concat(), "");
    assert_eq!((code, out.as_str()), (Some(0), ""));
    assert!(progress_lines(&stderr).is_empty(), "{stderr}");

    // Text mode: progress counts the 6 input lines (it used to count the translated parts:
    // the CLI now streams its input, whose lines are the unit a progress bar can total);
    // inside the chunk, each batch of parts (--scores shows one score per part; a long
    // sentence wrapped at 6 tokens counts each part) moves the lines done in proportion.
    let input = "Hello world. How are you?\nThe cat sat on the mat.\n\n   \nZebra quilt vex jinx. We love to read.\n\
                 The cat sat on the mat and the dog sat on the log and we love to read small texts.\n";
    let base = ["--model", model, "--beam", "1", "--max-decoding-length", "16", "--max-sentence-tokens", "6"];
    let (code, scored, stderr) = cli(&[&base[..], &["--scores"]].concat(), input);
    assert_eq!(code, Some(0), "{stderr}");
    let parts: usize = parse_text_score_lines(&scored).iter().map(|(scores, _)| scores.len()).sum();
    assert!(parts > 8, "{scored}");
    for batch in ["0", "1", "4"] {
        let args = [&base[..], &["--scores", "--progress", "--max-batch-size", batch]].concat();
        let (code, out, stderr) = cli(&args, input);
        assert_eq!((code, out.as_str()), (Some(0), scored.as_str()), "--max-batch-size {batch}: {stderr}");
        let lines = progress_lines(&stderr);
        let step: usize = batch.parse().unwrap();
        let mut want: Vec<(usize, usize)> = if step == 0 {
            vec![(6, 6)] // text mode's default batches of 32: one
        } else {
            (1..=parts.div_ceil(step)).map(|k| ((k * step).min(parts) * 6 / parts, 6)).collect()
        };
        want.dedup(); // a batch that moves no whole line is not reported
        assert_eq!(lines, want, "--max-batch-size {batch}: {stderr}");
    }
    // Blank lines only: nothing to translate, the lines are done when written (this used
    // to report nothing: no part was translated).
    let (code, out, stderr) = cli(&[&base[..], &["--progress"]].concat(), "\n  \n\n");
    assert_eq!((code, out.as_str()), (Some(0), "\n  \n\n"), "{stderr}");
    assert_eq!(progress_lines(&stderr), [(3, 3)], "{stderr}");

    if valgrind_available() {
        run_under_valgrind(&binary, &[&base[..], &["--progress", "--max-batch-size", "3"]].concat(), input);
    }
}

/// The fixture's sentences as `n` text lines, empty and blank ones among them.
fn fixture_text_lines(n: usize) -> String {
    let base = ["Hello world. How are you?", "The cat sat on the mat.", "", "Zebra quilt vex jinx. We love to read.", "  ", "z"];
    (0..n).map(|i| format!("{}\n", base[i % base.len()])).collect()
}

/// The CLI streams its input in chunks (--read-batch-size) translated by --inter-threads
/// workers: the output is the plain run's, in text and token modes, from stdin or --input
/// to stdout or --output; --progress counts lines against the total counted beforehand for
/// --input (and stdin redirected from a file), else "DONE/?" until the end is read.
#[test]
fn the_c_example_streams_in_chunks() {
    let binary = build_cli();
    let model = fixture();
    let model = model.to_str().unwrap();
    let cli = |args: &[&str], stdin: &str| run_program(&binary, args, stdin);
    let input = fixture_text_lines(240);
    let tokens: String = (0..240).map(|i| ["a b c\n", "h e l l o\n", "\n", "z\n", "m n q\n"][i % 5]).collect();
    let streamed = ["--inter-threads", "2", "--read-batch-size", "16"];
    for (args, input) in [
        (&["--model", model, "--max-decoding-length", "12", "--scores"][..], &input),
        (&["--model", model, "--max-decoding-length", "12", "--tokens", "--n-best", "2", "--scores", "--max-batch-size", "3"], &tokens),
    ] {
        let (code, plain, stderr) = cli(args, input);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(plain.lines().count(), 240 * if args.contains(&"--n-best") { 2 } else { 1 });
        let (code, out, stderr) = cli(&[args, &streamed[..]].concat(), input);
        assert_eq!((code, out.as_str()), (Some(0), plain.as_str()), "{streamed:?} changed the output: {stderr}");

        // Files: the same translation; progress totals known from the start.
        let dir = out_dir().join(format!("stream-{}", args.len()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (in_path, out_path) = (dir.join("in.txt"), dir.join("out.txt"));
        std::fs::write(&in_path, input).unwrap();
        let files = ["--input", in_path.to_str().unwrap(), "--output", out_path.to_str().unwrap(), "--progress"];
        let (code, out, stderr) = cli(&[args, &streamed[..], &files[..]].concat(), "");
        assert_eq!((code, out.as_str()), (Some(0), ""), "{stderr}");
        assert_eq!(std::fs::read_to_string(&out_path).unwrap(), plain);
        let progress = progress_lines(&stderr);
        assert!(progress.len() >= 240 / 16 && progress.iter().all(|&(_, total)| total == 240), "{stderr}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "a temporary file was left behind");
        // Standard input redirected from the file: counted too.
        let mut cmd = Command::new(&binary);
        cmd.args([args, &streamed[..], &["--progress"]].concat()).stdin(std::fs::File::open(&in_path).unwrap());
        let out = cmd.output().unwrap();
        assert_eq!(text(&out.stdout), plain);
        assert!(progress_lines(&text(&out.stderr)).iter().all(|&(_, total)| total == 240), "{}", text(&out.stderr));
        // A pipe: "DONE/?" until the end of the input is read, then DONE/240.
        let (code, out, stderr) = cli(&[args, &streamed[..], &["--progress"]].concat(), input);
        assert_eq!((code, out.as_str()), (Some(0), plain.as_str()), "{stderr}");
        let unknown = stderr.lines().take_while(|l| l.ends_with("/?")).count();
        assert!(unknown > 0 && progress_lines(&stderr).len() + unknown == stderr.lines().count(), "{stderr}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    // A failure leaves no output: an existing --output keeps its contents (invalid UTF-8
    // on line 100, after chunks were translated).
    let dir = out_dir().join("stream-failure");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (in_path, out_path) = (dir.join("in.txt"), dir.join("out.txt"));
    let mut bad = fixture_text_lines(99).into_bytes();
    bad.extend_from_slice(b"\xff bad\nmore\n");
    std::fs::write(&in_path, bad).unwrap();
    std::fs::write(&out_path, "before\n").unwrap();
    let args = ["--model", model, "--read-batch-size", "16", "--input", in_path.to_str().unwrap(), "--output", out_path.to_str().unwrap()];
    let (code, _, stderr) = cli(&args, "");
    assert!(code == Some(1) && stderr.contains("line 100 of") && stderr.contains("UTF-8"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "before\n");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "a temporary file was left behind");

    // Ctrl-C stops at the next batch: exit 130, no output file, no temporary file. (The
    // first progress line says the translation is under way.)
    std::fs::remove_file(&out_path).unwrap();
    std::fs::write(&in_path, fixture_text_lines(200_000)).unwrap();
    let mut child = Command::new(&binary)
        .args([&args[..], &["--progress"]].concat())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut first).unwrap();
    assert!(first.ends_with("/200000\n"), "{first}");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130), "{rest}");
    assert!(rest.contains("interrupted"), "{rest}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the input is left");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the CLI from --input to --output and returns its exit code and peak RSS in KiB
/// (wait4's ru_maxrss, this child's alone: other tests run programs concurrently).
#[allow(clippy::zombie_processes)] // reaped by wait4, which std's handle does not know of
fn peak_rss_kib(binary: &Path, args: &[&str]) -> (Option<i32>, i64) {
    let child = Command::new(binary).args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut status = 0;
    // SAFETY: plain libc call on our own child, reaped here (std's handle is not waited on).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, usage.ru_maxrss)
}

/// Memory does not grow with the input: 16000 lines peak at about the RSS of 4000 (the CLI
/// used to hold every line and translation: 19 MB for 5000 lines, 63 MB for 20000).
#[test]
fn the_c_example_translates_large_inputs_in_bounded_memory() {
    let binary = build_cli();
    let model = fixture();
    let dir = out_dir().join("stream-memory");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let long = "The cat sat on the mat and the dog sat on the log, and we love to read small texts. Hello world.";
    let mut peaks = Vec::new();
    for lines in [4000, 16000] {
        let input = dir.join(format!("in{lines}.txt"));
        let output = dir.join(format!("out{lines}.txt"));
        let text: String = (0..lines).map(|i| if i % 7 == 3 { "\n".to_string() } else { format!("{long} {i}\n") }).collect();
        std::fs::write(&input, text).unwrap();
        let args = ["--model", model.to_str().unwrap(), "--max-decoding-length", "8", "--inter-threads", "2"];
        let files = ["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()];
        let (code, peak) = peak_rss_kib(&binary, &[&args[..], &files[..]].concat());
        assert_eq!(code, Some(0));
        assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), lines);
        peaks.push(peak);
    }
    eprintln!("peak RSS: {} KiB for 4000 lines, {} KiB for 16000", peaks[0], peaks[1]);
    assert!(peaks[1] * 4 < peaks[0] * 5, "peak RSS grew with the input: {peaks:?} KiB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// examples-c/desktop.c shows progress in its status bar (stderr) while the worker
/// translates, and its Stop button (--cancel-after N: pressed once the status bar shows N
/// sentences or more) ends the translation with TOLK_ERROR_CANCELLED, shown as "stopped",
/// not as an error; Stop pressed too late changes nothing.
#[test]
fn the_desktop_example_shows_progress_and_stops() {
    let desktop = examples().desktop.clone();
    let model = fixture();
    let model = model.to_str().unwrap();
    // 7 sentences.
    let input = "Hello world. How are you?\nThe cat sat on the mat.\n\nZebra quilt vex jinx. We love to read.\n\
                 Pack my box. Say hello.\n";
    let status_lines = |stderr: &str| -> Vec<(usize, usize)> {
        stderr
            .lines()
            .filter_map(|l| l.strip_prefix("[status bar] translating... ")?.strip_suffix(" sentences")?.split_once('/'))
            .map(|(d, t)| (d.parse().unwrap(), t.parse().unwrap()))
            .collect()
    };

    let (code, full, stderr) = run_program(&desktop, &[model], input);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(full.contains("--- 7 aligned sentences ---"), "{full}");
    let shown = status_lines(&stderr);
    assert_eq!(shown.last(), Some(&(7, 7)), "the status bar ends at 7/7: {stderr}");
    assert!(shown.windows(2).all(|p| p[0].0 < p[1].0 && p[1].1 == 7), "{stderr}");

    // Batches of 2: the same translation, the status bar steps by 2 (the UI may skip steps).
    let (code, out, stderr) = run_program(&desktop, &["--batch-size", "2", model], input);
    assert_eq!((code, out.as_str()), (Some(0), full.as_str()), "{stderr}");
    let shown = status_lines(&stderr);
    assert_eq!(shown.last(), Some(&(7, 7)), "{stderr}");
    assert!(shown.iter().all(|&(d, t)| t == 7 && (d % 2 == 0 || d == 7)), "{stderr}");

    // Stop pressed: at the first step showing >= N the worker's callback says stop.
    for (cancel_after, stopped_at) in [("0", 2), ("1", 2), ("3", 4), ("6", 6), ("7", 7)] {
        let args = ["--batch-size", "2", "--cancel-after", cancel_after, model];
        let (code, out, stderr) = run_program(&desktop, &args, input);
        assert_eq!((code, out.as_str()), (Some(0), ""), "--cancel-after {cancel_after}: {stderr}");
        // With 0 the UI may press Stop before the first step: the worker stops there anyway.
        let pressed_early = cancel_after == "0" && stderr.contains("[Stop pressed at 0/0 sentences]");
        assert!(
            (pressed_early || stderr.contains(&format!("[Stop pressed at {stopped_at}/7 sentences]")))
                && stderr.contains(&format!("[status bar] Translation stopped at {stopped_at}/7 sentences")),
            "--cancel-after {cancel_after}: {stderr}"
        );
        assert!(!stderr.contains("error dialog"), "{stderr}");
        let expected: Vec<(usize, usize)> = (2..=stopped_at).step_by(2).chain((stopped_at == 7).then_some(7)).map(|d| (d, 7)).collect();
        assert_eq!(status_lines(&stderr), expected, "every step painted before Stop: {stderr}");
    }
    // Never reached: the whole translation.
    let (code, out, stderr) = run_program(&desktop, &["--cancel-after", "8", "--batch-size", "2", model], input);
    assert_eq!((code, out.as_str()), (Some(0), full.as_str()), "{stderr}");
    assert!(!stderr.contains("Stop pressed"), "{stderr}");
    // Nothing to translate: no progress, nothing to stop.
    let (code, out, stderr) = run_program(&desktop, &["--cancel-after", "0", model], "\n \n");
    assert_eq!((code, out.as_str()), (Some(0), "\n \n--- 0 aligned sentences ---\n"), "{stderr}");
    assert!(status_lines(&stderr).is_empty(), "{stderr}");

    for args in [&["--cancel-after", "x", model][..], &["--bogus", "1", model], &["--batch-size", "-1", model]] {
        let (code, _, stderr) = run_program(&desktop, args, input);
        assert!(code == Some(2) && stderr.contains(args[0]), "{args:?}: {code:?} {stderr}");
    }

    if valgrind_available() {
        run_under_valgrind(&desktop, &["--batch-size", "2", "--cancel-after", "3", model], input);
        run_under_valgrind(&desktop, &["--batch-size", "3", model], input);
    }
}

/// examples-c/desktop.c: loads the model, translates stdin or a file on its worker thread and
/// prints the translation (the CLI's, for the same lines) and the aligned sentence pairs,
/// whose byte ranges cut the source and the translation into exactly those sentences (the
/// parts of a wrapped sentence as one pair); NUL bytes in the input are text.
#[test]
fn the_desktop_example_translates_and_aligns_sentences() {
    let desktop = examples().desktop.clone();
    let model = fixture();
    let model = model.to_str().unwrap();
    let input = "Hello world. How are you?\nThe cat sat on the mat.\n\nZebra quilt vex jinx. We love to read.\n";
    let sentences =
        ["Hello world.", "How are you?", "The cat sat on the mat.", "Zebra quilt vex jinx.", "We love to read."];

    let (code, stdout, stderr) = run_program(&desktop, &[model], input);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("hover lookup failed"), "{stderr}");
    let marker = format!("--- {} aligned sentences ---\n", sentences.len());
    let (translation, pairs) = stdout.split_once(&marker).unwrap_or_else(|| panic!("no {marker:?} in {stdout:?}"));
    // The same translation as the CLI's, which translates line by line.
    let (code, by_lines, _) = run_program(&build_cli(), &["--model", model], input);
    assert_eq!((code, translation), (Some(0), by_lines.as_str()));

    // "N. source [a, b): S" and "   target [c, d): T" for each sentence.
    let parse = |line: &str, label: &str| -> (usize, usize, String) {
        let rest = line.split_once(label).unwrap_or_else(|| panic!("no {label:?} in {line:?}")).1;
        let (range, sentence) = rest.split_once("): ").unwrap();
        let (begin, end) = range.split_once(", ").unwrap();
        (begin.parse().unwrap(), end.parse().unwrap(), sentence.to_string())
    };
    let lines: Vec<&str> = pairs.lines().collect();
    assert_eq!(lines.len(), 2 * sentences.len(), "{pairs}");
    let (mut source_end, mut target_end) = (0, 0);
    for (i, pair) in lines.chunks(2).enumerate() {
        assert!(pair[0].starts_with(&format!("{}. source [", i + 1)), "{pairs}");
        let (sb, se, source) = parse(pair[0], "source [");
        let (tb, te, target) = parse(pair[1], "   target [");
        assert_eq!(source, sentences[i]);
        assert_eq!(&input[sb..se], source, "source range of sentence {i}");
        assert!(source_end <= sb && target_end <= tb && tb < te, "ranges out of order at sentence {i}: {pairs}");
        assert_eq!(&translation[tb..te], target, "target range of sentence {i}");
        (source_end, target_end) = (se, te);
    }

    // FILE instead of stdin.
    let file = out_dir().join("desktop_input.txt");
    std::fs::write(&file, input).unwrap();
    let (code, from_file, _) = run_program(&desktop, &[model, file.to_str().unwrap()], "");
    assert_eq!((code, from_file), (Some(0), stdout.clone()));

    // A sentence too long for one part (about 210 pieces of the tiny tokenizer, wrapped at
    // 128 tokens) is one aligned pair, from its first part's start to its last part's end
    // in the source and in the translation, with a note of its parts; hovering any part
    // finds it.
    let long = format!(
        "{}.",
        ["the cat sat on the mat and the dog sat on the log and we love to read small texts"; 4].join(", and ")
    );
    let input_long = format!("Hello world.\n{long}\n");
    let (code, stdout, stderr) = run_program(&desktop, &[model], &input_long);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("hover lookup failed"), "{stderr}");
    let (translation, pairs) = stdout
        .split_once("--- 2 aligned sentences ---\n")
        .unwrap_or_else(|| panic!("two sentences expected: {stdout:?}"));
    let (code, by_lines, _) = run_program(&build_cli(), &["--model", model], &input_long);
    assert_eq!((code, translation), (Some(0), by_lines.as_str()));
    let lines: Vec<&str> = pairs.lines().collect();
    assert_eq!(lines.len(), 5, "{pairs}");
    let (sb, se, source) = parse(lines[2], "source [");
    let (tb, te, target) = parse(lines[3], "   target [");
    assert_eq!((source.as_str(), sb, se), (long.as_str(), 13, 13 + long.len()), "{pairs}");
    assert_eq!((tb, te, &translation[tb..te]), (translation.find('\n').unwrap() + 1, translation.len() - 1, target.as_str()));
    assert_eq!(lines[4], "   (a long sentence, translated in 2 parts)", "{pairs}");

    // NUL bytes are text: the document goes to the library with its length (it used to be
    // cut at the NUL). The first sentence runs past the NUL.
    let input_nul = "Zebra quilt.\0 Hello world. How are you?\nWe love to read.\n";
    let (code, stdout, stderr) = run_program(&desktop, &[model], input_nul);
    assert_eq!(code, Some(0), "{stderr}");
    let (translation, pairs) = stdout
        .split_once("--- 3 aligned sentences ---\n")
        .unwrap_or_else(|| panic!("three sentences expected: {stdout:?}"));
    let (code, by_lines, _) = run_program(&build_cli(), &["--model", model], input_nul);
    assert_eq!((code, translation), (Some(0), by_lines.as_str()));
    let (_, _, first) = parse(pairs.lines().next().unwrap(), "source [");
    assert_eq!(first, "Zebra quilt.\0 Hello world.");

    // The error dialogs: the model does not load; the worker's translation fails (its
    // message, copied from the worker thread's tolk_last_error, reaches the UI); no file.
    let (code, out, stderr) = run_program(&desktop, &["/nonexistent/model"], input);
    assert!(code == Some(1) && out.is_empty() && stderr.contains("/nonexistent/model"), "{stderr}");
    let bare = fixture_without_tokenizer("desktop");
    let (code, out, stderr) = run_program(&desktop, &[bare.to_str().unwrap()], input);
    assert!(code == Some(1) && out.is_empty() && stderr.contains("SentencePiece"), "{code:?} {stderr}");
    let (code, _, stderr) = run_program(&desktop, &[model, "/nonexistent/input.txt"], "");
    assert!(code == Some(1) && stderr.contains("/nonexistent/input.txt"), "{stderr}");
    let (code, _, stderr) = run_program(&desktop, &[], "");
    assert!(code == Some(2) && stderr.contains("usage"), "{stderr}");

    if valgrind_available() {
        run_under_valgrind(&desktop, &[model], input);
        let mut cmd = Command::new("valgrind");
        cmd.args(["--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99"])
            .arg(&desktop)
            .arg(&bare);
        let out = run(cmd, input);
        assert_eq!(out.status.code(), Some(1), "valgrind found errors on an error path:\n{}", text(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(bare.parent().unwrap());
}

/// With the real zh-en model (TOLK_MODELS, else models/ or ../shared/models): the CLI's text
/// mode turns Chinese verses into English without SentencePiece's "▁", and gives exactly
/// the token mode's translation of python sentencepiece's pieces, detokenized (pieces
/// joined, "▁" -> space, trimmed). Skipped without the model, python3 or sentencepiece.
#[test]
fn the_c_example_text_mode_matches_token_mode_on_zh_en() {
    let Some(models) = zh_en_models() else {
        eprintln!("zh-en model not found: text mode not checked on it");
        return;
    };
    let model_dir = models.join("zh-en-ct2");
    let model = model_dir.to_str().unwrap();
    // One sentence per verse, so that sentence splitting cuts nothing.
    let verses = "耶稣基督是大卫的子孙，亚伯拉罕的后裔。\n你们要彼此相爱。\n我是世界的光。\n";
    let encode = "import sys, sentencepiece as s\n\
                  sp = s.SentencePieceProcessor(model_file=sys.argv[1])\n\
                  for line in sys.stdin.read().splitlines():\n    print(' '.join(sp.encode(line, out_type=str)))\n";
    let has_sentencepiece = Command::new("python3")
        .args(["-c", "import sentencepiece"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_sentencepiece {
        eprintln!("python3 with sentencepiece not available: text mode not checked on zh-en");
        return;
    }
    let mut cmd = Command::new("python3");
    cmd.args(["-c", encode]).arg(model_dir.join("sentencepiece.model")).env("PYTHONIOENCODING", "utf-8");
    let python = run(cmd, verses);
    assert!(python.status.success(), "python sentencepiece failed:\n{}", text(&python.stderr));
    let pieces = text(&python.stdout);
    assert_eq!(pieces.lines().count(), 3, "{pieces}");

    let binary = build_cli();
    let (code, by_tokens, stderr) = run_program(&binary, &["--model", model, "--tokens"], &pieces);
    assert_eq!(code, Some(0), "{stderr}");
    let expected: String = by_tokens
        .lines()
        .map(|l| format!("{}\n", l.split(' ').collect::<String>().replace('\u{2581}', " ").trim()))
        .collect();
    for split in ["sentences", "lines"] {
        let (code, by_text, stderr) = run_program(&binary, &["--model", model, "--split", split], verses);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(by_text.lines().count(), 3, "{by_text}");
        assert!(!by_text.contains('\u{2581}'), "{by_text}");
        assert!(
            by_text.lines().all(|l| l.is_ascii() && l.chars().any(|c| c.is_ascii_alphabetic())),
            "not English: {by_text}"
        );
        assert_eq!(by_text, expected, "--split {split}: text mode differs from token mode on python's pieces");
    }
    // The model adds an end token to every source: a part of at most 1 token has no room
    // for a piece.
    let (code, out, stderr) = run_program(&binary, &["--model", model, "--max-sentence-tokens", "1"], verses);
    assert!(code == Some(1) && out.is_empty() && stderr.contains("max_sentence_tokens"), "{code:?} {stderr}");
}

/// The first of TOLK_MODELS, models/ and ../shared/models that holds `file`.
fn models_with(file: &str) -> Option<PathBuf> {
    std::env::var_os("TOLK_MODELS")
        .map(PathBuf::from)
        .into_iter()
        .chain([manifest_dir().join("models"), manifest_dir().join("../shared/models")])
        .find(|d| d.join(file).is_file())
}

/// The folder holding zh-en-ct2/: TOLK_MODELS, else models/ or ../shared/models.
fn zh_en_models() -> Option<PathBuf> {
    models_with("zh-en-ct2/model.bin")
}

/// ffi-tests/marian_test.c: the en-pt Bergamot package through the C API (loaded by its
/// directory, YAML and model file, tolk_translator_translate_options, NULL and older-size
/// options, the shortlist, bad length factors, broken packages, one model on 4 threads),
/// next to the fixture's CTranslate2 defaults; also under valgrind. The package comes from
/// TOLK_MODELS, else models/ or ../shared/models; without it the test is compiled, not run.
#[test]
fn the_c_api_translates_with_marian_packages() {
    let binary = compile(&manifest_dir().join("ffi-tests/marian_test.c"));
    let Some(models) = models_with("en-pt-bergamot/model.enpt.intgemm.alphas.bin") else {
        eprintln!("en-pt-bergamot model not found (TOLK_MODELS): ffi-tests/marian_test.c was compiled, not run");
        return;
    };
    let en_pt = models.join("en-pt-bergamot");
    let fixture = fixture();
    let args = [fixture.to_str().unwrap(), en_pt.to_str().unwrap()];
    let (code, stdout, stderr) = run_program(&binary, &args, "");
    assert_eq!(code, Some(0), "{} failed:\n{stdout}{stderr}", binary.display());
    if valgrind_available() {
        run_under_valgrind(&binary, &args, "");
    }
}

/// ffi-tests/memory_test.c: tolk_model_load_from_memory on the fixture and, when
/// TOLK_MODELS (else models/ or ../shared/models) has them, the zh-en model and the en-pt
/// package: their files read into malloc'd buffers, freed after the call, and the same
/// translations as from the directories; NULL and invalid arguments. Also under valgrind.
#[test]
fn the_c_api_loads_models_from_memory() {
    let binary = compile(&manifest_dir().join("ffi-tests/memory_test.c"));
    let zh_en = zh_en_models().map(|m| m.join("zh-en-ct2"));
    let en_pt = models_with("en-pt-bergamot/model.enpt.intgemm.alphas.bin").map(|m| m.join("en-pt-bergamot"));
    if zh_en.is_none() || en_pt.is_none() {
        eprintln!("zh-en or en-pt-bergamot not found (TOLK_MODELS): memory_test runs on the fixture only");
    }
    let arg = |p: Option<PathBuf>| p.map_or("-".to_string(), |p| p.display().to_string());
    let args = [fixture().display().to_string(), arg(zh_en), arg(en_pt)];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = run_program(&binary, &args, "");
    assert_eq!(code, Some(0), "{} failed:\n{stdout}{stderr}", binary.display());
    if valgrind_available() {
        run_under_valgrind(&binary, &args, "");
    }
}

/// The README's C example compiles as printed and, where the zh-en model is available
/// (TOLK_MODELS, else models/ or ../shared/models), translates with it.
/// Runs `binary` in a fresh folder `name` whose `models` links to `models`: the README's
/// C code opens models/zh-en-ct2 relative to where it runs.
fn run_beside_models(binary: &Path, models: &Path, name: &str) -> Output {
    let cwd = out_dir().join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    let link = cwd.join("models");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(std::fs::canonicalize(models).unwrap(), &link).unwrap();
    let mut cmd = Command::new(binary);
    cmd.current_dir(&cwd);
    run(cmd, "")
}

#[test]
fn the_readme_c_example_compiles_and_runs() {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("README has a C example") + 5;
    let code = &readme[start..start + readme[start..].find("```").unwrap()];
    let source = out_dir().join("readme_example.c");
    std::fs::write(&source, code).unwrap();
    let binary = compile(&source);
    let Some(models) = zh_en_models() else {
        eprintln!("zh-en model not found: the README example was compiled, not run");
        return;
    };
    let out = run_beside_models(&binary, &models, "readme_cwd");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "README example failed: {}", text(&out.stderr));
    assert!(stdout.contains("love") && stdout.contains("(-"), "README example printed {stdout:?}");
}

/// The README's async fragment (the C block that submits a job), inside a program that loads the model:
/// the lines before the first statement are file scope, the rest the body of main.
#[test]
fn the_readme_async_c_fragment_compiles_and_runs() {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let fragment = readme
        .split("```c\n")
        .skip(1)
        .map(|b| &b[..b.find("```").unwrap()])
        .find(|b| b.contains("tolk_translate_text_async"))
        .expect("README has a C block that submits a job");
    let body_at = fragment.find("TolkTranslatorOptions").expect("the fragment sets translator options");
    let code = format!(
        "#include <stdio.h>\n#include \"tolk.h\"\n{}\nint main(void) {{\n TolkModel *model = NULL;\n \
         TolkModelOptions mo = tolk_model_options_default();\n mo.compute_type = \"int8\";\n mo.device = \"cpu\";\n \
         if (tolk_model_load_with_options(\"models/zh-en-ct2\", &mo, &model) != TOLK_OK) return 1;\n \
         TolkTranslator *translator = NULL;\n{}\n tolk_translator_free(translator);\n tolk_model_free(model);\n return 0;\n}}\n",
        &fragment[..body_at],
        &fragment[body_at..]
    );
    let source = out_dir().join("readme_async.c");
    std::fs::write(&source, code).unwrap();
    let binary = compile(&source);
    let Some(models) = zh_en_models() else {
        eprintln!("zh-en model not found: the README fragment was compiled, not run");
        return;
    };
    let out = run_beside_models(&binary, &models, "readme_async_cwd");
    assert!(out.status.success(), "README async fragment failed: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("love"), "README async fragment printed {:?}", text(&out.stdout));
}
