#!/usr/bin/env node
// Runs the WASM build of bergamot-translator (npm @browsermt/bergamot-translator@0.4.9)
// under Node on a Marian/Bergamot model directory, one input line per call
// (batch size 1), and writes one translation per line.
//
//   node bergamot_oracle.js --pkg DIR/node_modules/@browsermt/bergamot-translator \
//        --model-dir MODEL_DIR --input IN --output OUT [--ssplit sentence|paragraph]
//        [--max-length-factor F] [--max-length-break N] [--trace PREFIX]
//
// --trace PREFIX records every intgemm call the engine makes (through the wasm_gemm
// imports): PREFIX.json (one record per call: function, scales, shapes, offsets) and
// PREFIX.f32 (the float inputs of int8_prepare_a and the float outputs of
// int8_prepare_bias / int8_multiply_and_add_bias), for layer-by-layer comparison.
//
// Config: the model directory's config*.yml (models, vocabs, shortlist,
// beam-size, normalize, max-length-factor, gemm-precision) plus the
// bergamot defaults. Unlike the package's own worker (which forces
// max-length-factor 2.0), the yml's max-length-factor is kept.
// ssplit "sentence" = the whole line is one sentence (no sentence splitting),
// which is what a token-level engine sees; "paragraph" is bergamot's default
// (the line is split into sentences, each translated on its own, then joined).
// The WASM intgemm import module "wasm_gemm" is linked to the fallback
// implementations that the .wasm itself exports (int8*Fallback), exactly as
// translator-worker.js does when no native (Firefox) gemm is available.
'use strict';
const fs = require('fs');
const path = require('path');

function parseArgs(argv) {
  const a = {ssplit: 'sentence', maxLengthBreak: 512, ids: false};
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i];
    const v = () => argv[++i];
    if (k === '--pkg') a.pkg = v();
    else if (k === '--model-dir') a.modelDir = v();
    else if (k === '--input') a.input = v();
    else if (k === '--output') a.output = v();
    else if (k === '--ssplit') a.ssplit = v();
    else if (k === '--max-length-factor') a.maxLengthFactor = v();
    else if (k === '--max-length-break') a.maxLengthBreak = parseInt(v());
    else if (k === '--timing') a.timing = v();
    else if (k === '--trace') a.trace = v();
    else throw new Error('unknown argument ' + k);
  }
  for (const r of ['pkg', 'modelDir', 'input', 'output'])
    if (!a[r]) throw new Error('missing --' + r);
  return a;
}

// Tiny YAML reader for Marian configs (top-level scalars and lists).
function parseYaml(text) {
  const out = {};
  let key = null;
  for (const raw of text.split('\n')) {
    const line = raw.replace(/#.*$/, '');
    if (!line.trim()) continue;
    let m;
    if ((m = line.match(/^\s*-\s+(.+?)\s*$/)) && key) {
      if (!Array.isArray(out[key])) out[key] = [];
      out[key].push(m[1]);
    } else if ((m = line.match(/^([A-Za-z0-9_][A-Za-z0-9_-]*):\s*(.*?)\s*$/))) {
      key = m[1];
      out[key] = m[2];
    }
  }
  return out;
}

function main() {
  const args = parseArgs(process.argv);
  const workerDir = path.join(args.pkg, 'worker');
  const ymls = fs.readdirSync(args.modelDir).filter(f => /^config.*\.yml$/.test(f));
  if (ymls.length === 0) throw new Error('no config*.yml in ' + args.modelDir);
  const cfg = parseYaml(fs.readFileSync(path.join(args.modelDir, ymls[0]), 'utf8'));
  const modelFile = path.join(args.modelDir, cfg.models[0]);
  const vocabFiles = (cfg.vocabs || []).map(v => path.join(args.modelDir, v));
  const shortlistFile = cfg.shortlist ? path.join(args.modelDir, cfg.shortlist[0]) : null;

  const wasmBinary = fs.readFileSync(path.join(workerDir, 'bergamot-translator-worker.wasm'));
  const glue = fs.readFileSync(path.join(workerDir, 'bergamot-translator-worker.js'), 'utf8');
  const FALLBACK = {
    int8_prepare_a: 'int8PrepareAFallback',
    int8_prepare_b: 'int8PrepareBFallback',
    int8_prepare_b_from_transposed: 'int8PrepareBFromTransposedFallback',
    int8_prepare_b_from_quantized_transposed: 'int8PrepareBFromQuantizedTransposedFallback',
    int8_prepare_bias: 'int8PrepareBiasFallback',
    int8_multiply_and_add_bias: 'int8MultiplyAndAddBiasFallback',
    int8_select_columns_of_b: 'int8SelectColumnsOfBFallback',
  };
  global.Module = {
    print: s => process.stderr.write(s + '\n'),
    printErr: s => process.stderr.write(s + '\n'),
    instantiateWasm(info, accept) {
      const gemm = {};
      for (const [k, name] of Object.entries(FALLBACK))
        gemm[k] = (...xs) => global.Module.asm[name](...xs);
      if (args.trace) installTrace(gemm, args.trace);
      WebAssembly.instantiate(wasmBinary, {...info, wasm_gemm: gemm})
        .then(({instance}) => accept(instance))
        .catch(e => { console.error(e); process.exit(2); });
      return {};
    },
    onRuntimeInitialized() { run(global.Module, args, cfg, modelFile, vocabFiles, shortlistFile); },
  };
  eval.call(global, glue);
}

const TRACE = {records: [], chunks: [], floats: 0, on: false};
function installTrace(gemm, prefix) {
  const f32 = (ptr, n) => {
    const a = new Float32Array(global.Module.HEAPF32.buffer, ptr, n).slice();
    const off = TRACE.floats;
    TRACE.chunks.push(Buffer.from(a.buffer));
    TRACE.floats += n;
    return off;
  };
  const pa = gemm.int8_prepare_a, pbias = gemm.int8_prepare_bias, mul = gemm.int8_multiply_and_add_bias;
  gemm.int8_prepare_a = (input, scale, zp, rows, width, output) => {
    if (TRACE.on) TRACE.records.push({fn: 'prepare_a', scale, rows, width, input: f32(input, rows * width)});
    return pa(input, scale, zp, rows, width, output);
  };
  gemm.int8_prepare_bias = (b, sA, zA, sB, zB, width, cols, bias, out) => {
    const r = pbias(b, sA, zA, sB, zB, width, cols, bias, out);
    if (TRACE.on) TRACE.records.push({fn: 'prepare_bias', scaleA: sA, scaleB: sB, width, cols, hasBias: bias !== 0, output: f32(out, cols)});
    return r;
  };
  gemm.int8_multiply_and_add_bias = (A, sA, zA, B, sB, zB, bias, unq, rows, width, cols, out) => {
    const r = mul(A, sA, zA, B, sB, zB, bias, unq, rows, width, cols, out);
    if (TRACE.on) TRACE.records.push({fn: 'multiply', scaleA: sA, scaleB: sB, unquant: unq, rows, width, cols, output: f32(out, rows * cols)});
    return r;
  };
  TRACE.prefix = prefix;
}

function aligned(M, file, alignment) {
  const bytes = fs.readFileSync(file);
  const mem = new M.AlignedMemory(bytes.byteLength, alignment);
  mem.getByteArrayView().set(bytes);
  return mem;
}

function run(M, args, cfg, modelFile, vocabFiles, shortlistFile) {
  const t0 = process.hrtime.bigint();
  const modelMem = aligned(M, modelFile, 256);
  const shortlistMem = shortlistFile ? aligned(M, shortlistFile, 64) : new M.AlignedMemory(0, 64);
  const uniq = [...new Set(vocabFiles)];
  const vocabs = new M.AlignedMemoryList();
  for (const v of uniq) vocabs.push_back(aligned(M, v, 64));
  const conf = {
    'beam-size': cfg['beam-size'] || '1',
    'normalize': cfg['normalize'] || '1.0',
    'word-penalty': cfg['word-penalty'] || '0',
    'max-length-factor': args.maxLengthFactor || cfg['max-length-factor'] || '2.5',
    'gemm-precision': cfg['gemm-precision'] || 'int8shiftAlphaAll',
    'cpu-threads': '0',
    'skip-cost': 'true',
    'quiet': 'true',
    'quiet-translation': 'true',
    'alignment': 'soft',
    'ssplit-mode': args.ssplit,
    'max-length-break': String(args.maxLengthBreak),
    'mini-batch-words': '4096',
    'workspace': '128',
  };
  if (conf['gemm-precision'] === 'int8') conf['gemm-precision'] = 'int8shiftAll';
  const yaml = Object.entries(conf).map(([k, v]) => `${k}: ${v}`).join('\n') + '\n';
  const model = new M.TranslationModel(yaml, modelMem, shortlistMem, vocabs, null);
  const service = new M.BlockingService({cacheSize: 0});
  const t1 = process.hrtime.bigint();

  const lines = fs.readFileSync(args.input, 'utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = [];
  TRACE.on = !!args.trace;
  for (const line of lines) {
    if (args.trace) TRACE.records.push({fn: 'sentence', text: line});
    const input = new M.VectorString();
    input.push_back(line);
    const opts = new M.VectorResponseOptions();
    opts.push_back({qualityScores: false, alignment: false, html: false});
    const res = service.translate(model, input, opts);
    out.push(res.get(0).getTranslatedText().replace(/\n/g, ' '));
    res.delete(); input.delete(); opts.delete();
  }
  const t2 = process.hrtime.bigint();
  fs.writeFileSync(args.output, out.join('\n') + '\n');
  if (args.trace) {
    fs.writeFileSync(TRACE.prefix + '.json', JSON.stringify(TRACE.records));
    fs.writeFileSync(TRACE.prefix + '.f32', Buffer.concat(TRACE.chunks));
  }
  const load = Number(t1 - t0) / 1e9, tr = Number(t2 - t1) / 1e9;
  const timing = {load_s: load, translate_s: tr, sentences: lines.length,
                  sentences_per_s: lines.length / tr, config: conf};
  process.stderr.write(JSON.stringify(timing) + '\n');
  if (args.timing) fs.writeFileSync(args.timing, JSON.stringify(timing, null, 1));
  process.exit(0);
}

main();
