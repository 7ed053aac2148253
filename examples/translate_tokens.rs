//! Translates space-separated tokens read from stdin: `cargo run --release --example
//! translate_tokens -- MODEL_DIR [BEAM] [COMPUTE_TYPE]`. A minimal use of the Rust API.
use std::io::BufRead;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("usage: translate_tokens MODEL_DIR [BEAM] [COMPUTE_TYPE]");
    let beam: usize = args.get(2).map(|b| b.parse().expect("BEAM is a number")).unwrap_or(1);
    let compute = args.get(3).map(|c| tolk::ComputeType::parse(c).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_default();
    let model = tolk::Model::load_with(dir, compute).unwrap_or_else(|e| panic!("{e}"));
    let translator = tolk::Translator::with_config(&model, &Default::default()).unwrap();
    let source: Vec<Vec<String>> = std::io::stdin()
        .lock()
        .lines()
        .map(|l| l.unwrap().split_whitespace().map(str::to_string).collect())
        .collect();
    let options = tolk::TranslateOptions { beam_size: beam, return_scores: true, max_batch_size: 32, ..Default::default() };
    let t = std::time::Instant::now();
    let results = translator.translate_batch(&source, None, &options).unwrap();
    let n: usize = results.iter().map(|r| r.hypotheses[0].len()).sum();
    for r in &results {
        println!("{:.6}\t{}", r.scores[0], r.hypotheses[0].join(" "));
    }
    eprintln!("{} target tokens in {:.2}s: {:.1} tokens/s", n, t.elapsed().as_secs_f64(), n as f64 / t.elapsed().as_secs_f64());
}
