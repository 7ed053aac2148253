//! Translates stdin, a whole document, as text: `cargo run --release --example
//! translate_text -- MODEL_DIR [BEAM] < text`. The Rust text API in a few lines: the
//! package's SentencePiece model is found at load, paragraphs and spacing are kept, and
//! progress goes to stderr.
use std::io::Read;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("usage: translate_text MODEL_DIR [BEAM] < text");
    let beam: usize = args.get(2).map(|b| b.parse().expect("BEAM is a number")).unwrap_or(2);
    let model = tolk::Model::load(dir).unwrap_or_else(|e| panic!("{e}"));
    let translator = tolk::Translator::with_config(&model, &Default::default()).unwrap();
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).expect("stdin is UTF-8 text");
    let options = tolk::TranslateOptions { beam_size: beam, ..Default::default() };
    let mut progress = |done: usize, total: usize| {
        eprint!("\r{done}/{total} sentences");
        true // false would cancel
    };
    let out = translator
        .translate_text_with_progress(&[text], &options, &tolk::TextOptions::default(), &mut progress)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!();
    print!("{}", out[0].text);
}
