//! Measures one tuning switch (`tolk::backend::cpu::tuning::Switch`) on this machine: one
//! process loads zh-en once and translates the same verses with the switch on and off in
//! turn, round after round, the order alternating, and prints each round's tokens/s and the
//! gain. On a shared VM, runs in separate processes drift 5-15% apart; within one process,
//! alternating, a few percent shows through (how the panel-outer order was measured).
//!
//! ```sh
//! cargo run --release --example ab -- --switch int8-panels-outer --isa avx2 [--beam 1]
//!     [--verses 250] [--rounds 6] [--compute-type int8] [--model DIR] [--source FILE]
//! ```
//! Switches: int8-hexadecets, int8-panels-outer, attention-prefetch. Models and data as the
//! tests find them: `$TOLK_MODELS` (holding `zh-en-ct2/`), `$TOLK_DATA` (holding
//! `dev-matthew.zh`), else `../shared/...`, else `models/` and `data/`. Another model takes
//! its package's decoding options (a Marian package's beam and shortlist) and its source
//! language's verses: `--model models/en-pt-bergamot --source data/dev-matthew.en`; the
//! compute type is then the model's own unless `--compute-type` names one.
use std::path::PathBuf;
use std::time::Instant;
use tolk::backend::cpu::tuning::Switch;

struct Args {
    switch: Switch,
    isa: Option<String>,
    beam: Option<usize>,
    verses: usize,
    rounds: usize,
    compute_type: Option<String>,
    model: Option<PathBuf>,
    source: PathBuf,
}

fn found(var: &str, shared: &str, local: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| [shared, local].into_iter().map(PathBuf::from).find(|p| p.is_dir()).unwrap_or_else(|| local.into()))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        switch: Switch::Int8PanelsOuter,
        isa: None,
        beam: None,
        verses: 250,
        rounds: 6,
        compute_type: None,
        model: None,
        source: found("TOLK_DATA", "../shared/data", "data").join("dev-matthew.zh"),
    };
    let mut switch = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("{flag}: not a number: {v}"));
        match flag.as_str() {
            "--switch" => {
                let v = value()?;
                let names: Vec<&str> = Switch::ALL.iter().map(|s| s.name()).collect();
                switch = Some(Switch::parse(&v).ok_or(format!("unknown switch {v:?}; one of {}", names.join(", ")))?);
            }
            "--isa" => a.isa = Some(value()?),
            "--beam" => a.beam = Some(number(value()?)?.max(1)),
            "--verses" => a.verses = number(value()?)?.max(1),
            "--rounds" => a.rounds = number(value()?)?.max(1),
            "--compute-type" => a.compute_type = Some(value()?),
            "--model" => a.model = Some(value()?.into()),
            "--source" => a.source = value()?.into(),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    a.switch = switch.ok_or("--switch NAME is required")?;
    Ok(a)
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string());
    let name = field("model name").unwrap_or_else(|| "unknown CPU".into());
    match (field("cpu family"), field("model\t")) {
        (Some(family), Some(model)) => format!("{name} (family {family} model {model})"),
        _ => name,
    }
}

fn run(a: &Args) -> Result<(), String> {
    if let Some(isa) = &a.isa {
        // Before anything reads the level (the first product does).
        std::env::set_var("TOLK_CPU_ISA", isa);
    }
    // zh-en in int8, greedy, batches of 32 (bench.py's settings) unless told otherwise.
    let zh_en = found("TOLK_MODELS", "../shared/models", "models").join("zh-en-ct2");
    let compute = match (&a.compute_type, &a.model) {
        (Some(c), _) => tolk::ComputeType::parse(c).map_err(|e| e.to_string())?,
        (None, Some(_)) => tolk::ComputeType::Default,
        (None, None) => tolk::ComputeType::parse("int8").map_err(|e| e.to_string())?,
    };
    let model = tolk::Model::load_with(a.model.as_ref().unwrap_or(&zh_en), compute).map_err(|e| e.to_string())?;
    let tokenizer = model.tokenizer().ok_or("the model has no SentencePiece model beside it")?;
    let text = std::fs::read_to_string(&a.source).map_err(|e| format!("{}: {e}", a.source.display()))?;
    let source: Vec<Vec<String>> = text.lines().take(a.verses).map(|l| tokenizer.encode(l).into_iter().map(|p| p.piece).collect()).collect();
    let translator = tolk::Translator::with_config(&model, &Default::default()).map_err(|e| e.to_string())?;
    let mut options = translator.default_options();
    if a.model.is_none() {
        (options.beam_size, options.max_batch_size) = (1, 32);
    }
    options.beam_size = a.beam.unwrap_or(options.beam_size);
    let translate = || -> Result<f64, String> {
        let t = Instant::now();
        let results = translator.translate_batch(&source, None, &options).map_err(|e| e.to_string())?;
        let tokens: usize = results.iter().map(|r| r.hypotheses[0].len()).sum();
        Ok(tokens as f64 / t.elapsed().as_secs_f64())
    };
    println!(
        "{}; Tolk's ISA {}; {}: {}, {}, {} verses, {} rounds; switch {} (default here: {})",
        cpu_model(),
        tolk::backend::cpu::isa::current().name(),
        model.translation_model().description(),
        format!("{:?}", model.compute_type()).to_lowercase(),
        if options.beam_size == 1 { "greedy".to_string() } else { format!("beam {}", options.beam_size) },
        source.len(),
        a.rounds,
        a.switch.name(),
        if a.switch.is_on() { "on" } else { "off" },
    );
    translate()?; // warm-up: pages, caches, the workers' buffers
    let mut gains = Vec::new();
    for round in 0..a.rounds {
        let mut rate = [0.0f64; 2]; // [off, on]
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for on in order {
            a.switch.set(Some(on));
            rate[on as usize] = translate()?;
        }
        let gain = 100.0 * (rate[1] / rate[0] - 1.0);
        println!("round {}: off {:.1}, on {:.1} tokens/s: on {gain:+.1}%", round + 1, rate[0], rate[1]);
        gains.push(gain);
    }
    a.switch.set(None);
    gains.sort_by(f64::total_cmp);
    let mean = gains.iter().sum::<f64>() / gains.len() as f64;
    let ahead = gains.iter().filter(|&&g| g > 0.0).count();
    let median = (gains[(gains.len() - 1) / 2] + gains[gains.len() / 2]) / 2.0;
    println!("on against off: mean {mean:+.1}%, median {median:+.1}%, ahead in {ahead} of {} rounds", gains.len());
    Ok(())
}

fn main() {
    if let Err(e) = parse_args().and_then(|a| run(&a)) {
        eprintln!("ab: {e}");
        std::process::exit(2);
    }
}
