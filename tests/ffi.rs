//! Builds the C programs in `ffi-tests/` and `examples-c/` against `include/tolk.h` and the
//! freshly built `libtolk.so`, runs them on a tiny model, and again under valgrind when it
//! is installed (no leaks, no invalid accesses).
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folder holding libtolk.so for the profile the tests were built with.
fn lib_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| manifest_dir().join("target"));
    let dir = target.join(if cfg!(debug_assertions) { "debug" } else { "release" });
    assert!(
        dir.join("libtolk.so").is_file(),
        "{} is missing: build the library first (cargo build --release --lib)",
        dir.join("libtolk.so").display()
    );
    dir
}

/// Compiles one C file against the header and the shared library; returns the binary.
fn compile(source: &Path, name: &str) -> PathBuf {
    let out_dir = manifest_dir().join("target").join("ffi-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    // The SONAME is libtolk.so.0: give the loader that name next to the binaries.
    // Tests run in parallel: replace the link atomically (rename) so that a program
    // started by another test never sees it missing.
    let link = out_dir.join("libtolk.so.0");
    let tmp = out_dir.join(format!("libtolk.so.0.{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(lib_dir().join("libtolk.so"), &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    let binary = out_dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c99", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(manifest_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&binary)
        .arg("-L")
        .arg(lib_dir())
        .args(["-ltolk", "-lpthread", "-lm"])
        .arg(format!("-Wl,-rpath,{}", out_dir.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    binary
}

fn tiny_model(name: &str) -> PathBuf {
    common::write_model_dir(&common::temp_dir(name), &common::tiny_model_bin(11, 12), &common::tiny_vocabulary(12))
}

fn valgrind_available() -> bool {
    Command::new("valgrind").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn run_under_valgrind(binary: &Path, args: &[&Path], stdin: Option<&str>) {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--show-leak-kinds=definite,indirect", "--error-exitcode=99"])
        .arg(binary)
        .args(args);
    let output = run_with_stdin(cmd, stdin);
    assert!(
        output.status.success(),
        "valgrind found errors in {}:\n{}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn run_with_stdin(mut cmd: Command, stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let input = stdin.unwrap_or("").to_string();
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

#[test]
fn c_api_tests_pass_and_run_clean_under_valgrind() {
    let model = tiny_model("ffi-api");
    let binary = compile(&manifest_dir().join("ffi-tests/api_test.c"), "api_test");
    let output = Command::new(&binary).arg(&model).output().unwrap();
    assert!(output.status.success(), "api_test failed:\n{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if valgrind_available() {
        run_under_valgrind(&binary, &[&model], None);
    } else {
        eprintln!("valgrind is not installed: skipped the memory check");
    }
}

#[test]
fn the_c_example_translates_lines_and_reports_errors() {
    let model = tiny_model("ffi-cli");
    let binary = compile(&manifest_dir().join("examples-c/tolk-translate.c"), "tolk-translate");
    let input = "w3 w4 w5\n\nw6 unknown-token w7\n";
    let mut cmd = Command::new(&binary);
    cmd.arg("--model").arg(&model).args(["--tokens", "--beam", "2", "--n-best", "2", "--scores", "--max-decoding-length", "8"]);
    let out = run_with_stdin(cmd, Some(input));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "two hypotheses per input line:\n{text}");
    assert!(lines.iter().all(|l| l.contains(" ||| ")), "{text}");
    assert!(lines[2].starts_with("0.000000 ||| "), "an empty line translates to nothing with score 0: {text}");

    // Errors: a clear message and a non-zero exit.
    for args in [vec!["--beam", "x"], vec!["--tokens"], vec!["--bogus", "1"]] {
        let out = run_with_stdin({ let mut c = Command::new(&binary); c.args(&args); c }, Some(""));
        assert!(!out.status.success() && !out.stderr.is_empty(), "{args:?} should fail with a message");
    }
    let mut cmd = Command::new(&binary);
    cmd.args(["--model", "/nonexistent/model", "--tokens"]);
    let out = run_with_stdin(cmd, Some("w3\n"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model"));
    let mut cmd = Command::new(&binary);
    cmd.arg("--model").arg(&model).args(["--tokens", "--beam", "0"]);
    let out = run_with_stdin(cmd, Some("w3\n"));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("beam"));

    if valgrind_available() {
        run_under_valgrind(&binary, &[Path::new("--model"), &model, Path::new("--tokens"), Path::new("--beam"), Path::new("3")], Some(input));
    }
}
