//! A translator's threads are gone when it is freed: a host that unloads the library
//! (dlclose) must not have threads still running its code. Alone in its file, so that no
//! other test starts threads in this process meanwhile.
mod common;

use common::*;
use tolk::{Model, TranslateOptions, Translator, TranslatorConfig};

const VOCAB: usize = 12;

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// The thread count once it has fallen to `want`, or what it is after a second. A joined
/// thread can stay listed in /proc/self/task for a moment: `pthread_join` returns when the
/// kernel clears the thread's id, which happens before the kernel reaps the task.
fn threads_settled_to(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let now = threads_now();
        if now <= want || std::time::Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn freeing_a_translator_joins_its_threads() {
    if threads_now() == 0 {
        eprintln!("no /proc/self/task: skipped");
        return;
    }
    let dir = write_model_dir(&temp_dir("threads-join"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    let model = Model::load(&dir).unwrap();
    let before = threads_now();
    for round in 0..5 {
        let config = TranslatorConfig { intra_threads: 4, ..Default::default() };
        let translator = Translator::with_config(&model, &config).unwrap();
        let src = vec![vec!["w3".to_string(), "w4".to_string()]; 8];
        translator.translate_batch(&src, None, &TranslateOptions::default()).unwrap();
        assert!(threads_now() >= before + 4, "round {round}: the pool runs 4 threads");
        drop(translator);
        assert_eq!(threads_settled_to(before), before, "round {round}: threads left after the translator was freed");
    }
}
