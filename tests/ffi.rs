//! The C side of the library, tested from C: compiles every `ffi-tests/*.c` and the
//! example `examples-c/tolk-translate.c` against `include/tolk.h` and the `libtolk.so` that
//! `cargo build --release` wrote, runs them on the committed CTranslate2 fixture
//! `ffi-tests/fixtures/tiny`, and again under valgrind when it is on PATH (no invalid
//! accesses, no definite or indirect leaks).
//!
//! `cargo test` does not relink libtolk.so: build it first (scripts/test.sh does). The
//! tests refuse a library older than the sources rather than test stale code.
//! Environment: CC (C compiler, default cc/gcc/clang), CARGO_TARGET_DIR, TOLK_LIB_DIR
//! (test another build of the library).
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
fn run(mut cmd: Command, stdin: &str) -> Output {
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
    let input = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes()); // the program may exit without reading
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
        .arg(binary)
        .args(args);
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

#[test]
fn c_api_tests_pass_and_run_clean_under_valgrind() {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(manifest_dir().join("ffi-tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
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

/// Builds the CLI with its Makefile (make is part of what is tested), or directly
/// without make.
fn build_cli() -> PathBuf {
    let has_make = Command::new("make").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if !has_make {
        eprintln!("make is not installed: compiling examples-c/tolk-translate.c directly");
        return compile(&manifest_dir().join("examples-c/tolk-translate.c"));
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
    build.join("tolk-translate")
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
        (&["--model", model], "--tokens"), // text mode is not available yet
        (&["--model", model, "--tokens", "--beam", "x"], "--beam"),
        (&["--model", model, "--tokens", "--beam", "-1"], "--beam"),
        (&["--model", model, "--tokens", "--n-best", "99999999999"], "--n-best"),
        (&["--model", model, "--tokens", "--beam"], "--beam"),
        (&["--model", model, "--tokens", "--bogus", "1"], "--bogus"),
        (&["--model", model, "--tokens", "--batch-type", "lines"], "--batch-type"),
        (&["--model", model, "--tokens", "--length-penalty", "long"], "--length-penalty"),
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
        (&["--model", model, "--tokens", "--max-decoding-length", "0"], "decoding length"),
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

/// The README's C example compiles as printed and, where the zh-en model is available
/// (TOLK_MODELS, else models/ or ../shared/models), translates with it.
#[test]
fn the_readme_c_example_compiles_and_runs() {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("README has a C example") + 5;
    let code = &readme[start..start + readme[start..].find("```").unwrap()];
    let source = out_dir().join("readme_example.c");
    std::fs::write(&source, code).unwrap();
    let binary = compile(&source);
    let models = std::env::var_os("TOLK_MODELS")
        .map(PathBuf::from)
        .into_iter()
        .chain([manifest_dir().join("models"), manifest_dir().join("../shared/models")])
        .find(|d| d.join("zh-en-ct2/model.bin").is_file());
    let Some(models) = models else {
        eprintln!("zh-en model not found: the README example was compiled, not run");
        return;
    };
    // The example opens models/zh-en-ct2 relative to where it runs.
    let cwd = out_dir().join("readme_cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let link = cwd.join("models");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(std::fs::canonicalize(&models).unwrap(), &link).unwrap();
    let mut cmd = Command::new(&binary);
    cmd.current_dir(&cwd);
    let out = run(cmd, "");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "README example failed: {}", text(&out.stderr));
    assert!(stdout.contains("love") && stdout.contains("(-"), "README example printed {stdout:?}");
}
