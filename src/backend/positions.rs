//! Position tables generated on the host instead of held.
//!
//! A CTranslate2 model converted from Hugging Face's Marian (every OPUS-MT model, zh-en
//! among them) stores its sinusoids as a table: `[2048, 512]` float32, 4 MB, row `p` being
//! `sin(p / 10000^(2i/d))` in its first half and the cosines in its second, computed in
//! float64 and rounded. Holding that table means either reading it from the mapped
//! `model.bin` (which faults when the file is rewritten in place under a loaded model) or
//! owning 4 MB of which a translation uses a few rows. So a host backend checks the stored
//! table against the formula bit for bit at load (about 9 ms for zh-en's) and, when they
//! agree, generates rows in chunks as positions are first reached.
use std::sync::OnceLock;

/// Rows generated at a time (64 KB at d = 512).
const CHUNK_ROWS: usize = 32;

/// A `[rows, dim]` table of float64 sinusoids rounded to float32, generated lazily.
pub struct SinusoidTable {
    rows: usize,
    dim: usize,
    /// `10000^(2i / dim)` for each column pair `i`, the divisor of the position.
    divisors: Vec<f64>,
    chunks: Vec<OnceLock<Box<[f32]>>>,
}

impl SinusoidTable {
    /// The generator of `stored` (`rows` x `dim`, row-major) if it holds exactly these
    /// sinusoids, every value's bits; `None` for any other table (learned positions, other
    /// formulas or layouts).
    pub fn recognize(stored: &[f32], rows: usize, dim: usize) -> Option<SinusoidTable> {
        if rows == 0 || dim < 2 || !dim.is_multiple_of(2) || stored.len() != rows.checked_mul(dim)? {
            return None;
        }
        let table = SinusoidTable::new(rows, dim);
        let mut chunk = vec![0.0; CHUNK_ROWS * dim];
        for (c, expected) in stored.chunks(CHUNK_ROWS * dim).enumerate() {
            let generated = &mut chunk[..expected.len()];
            table.generate(c * CHUNK_ROWS, generated);
            if generated.iter().zip(expected).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return None;
            }
        }
        Some(table)
    }

    fn new(rows: usize, dim: usize) -> SinusoidTable {
        let divisors = (0..dim / 2).map(|i| 10000f64.powf((2 * i) as f64 / dim as f64)).collect();
        SinusoidTable { rows, dim, divisors, chunks: (0..rows.div_ceil(CHUNK_ROWS)).map(|_| OnceLock::new()).collect() }
    }

    /// Rows `first..` into `out` (whole rows).
    fn generate(&self, first: usize, out: &mut [f32]) {
        let half = self.dim / 2;
        for (r, row) in out.chunks_exact_mut(self.dim).enumerate() {
            let p = (first + r) as f64;
            let (sines, cosines) = row.split_at_mut(half);
            for ((s, c), divisor) in sines.iter_mut().zip(cosines).zip(&self.divisors) {
                let (sin, cos) = (p / divisor).sin_cos();
                (*s, *c) = (sin as f32, cos as f32);
            }
        }
    }

    /// Number of positions (the stored table's rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Row `position` (< [`rows`](Self::rows)), generated with its chunk on first use.
    pub fn row(&self, position: usize) -> &[f32] {
        assert!(position < self.rows, "position {position} past the table's {} rows", self.rows);
        let c = position / CHUNK_ROWS;
        let chunk = self.chunks[c].get_or_init(|| {
            let rows = CHUNK_ROWS.min(self.rows - c * CHUNK_ROWS);
            let mut data = vec![0.0; rows * self.dim].into_boxed_slice();
            self.generate(c * CHUNK_ROWS, &mut data);
            data
        });
        &chunk[(position % CHUNK_ROWS) * self.dim..][..self.dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formula as Hugging Face writes it (per column `j`, the pair `j / 2`, then the
    /// even columns' sines and the odd columns' cosines side by side), for comparison.
    fn hugging_face_table(rows: usize, dim: usize) -> Vec<f32> {
        let mut out = vec![0.0; rows * dim];
        for p in 0..rows {
            for j in 0..dim {
                let angle = p as f64 / 10000f64.powf((2 * (j / 2)) as f64 / dim as f64);
                let column = if j % 2 == 0 { j / 2 } else { dim / 2 + j / 2 };
                out[p * dim + column] = if j % 2 == 0 { angle.sin() } else { angle.cos() } as f32;
            }
        }
        out
    }

    #[test]
    fn recognizes_the_formula_and_generates_it_row_by_row() {
        let (rows, dim) = (70, 16);
        let stored = hugging_face_table(rows, dim);
        let table = SinusoidTable::recognize(&stored, rows, dim).expect("the formula's own table");
        assert_eq!((table.rows(), table.dim()), (rows, dim));
        for p in [69, 0, 33, 31, 32, 64, 5] {
            assert_eq!(table.row(p), &stored[p * dim..(p + 1) * dim], "row {p}");
        }
    }

    #[test]
    fn any_other_table_is_not_recognized() {
        let (rows, dim) = (40, 8);
        let stored = hugging_face_table(rows, dim);
        for (at, value) in [(0, -0.0), (39 * dim + 7, 0.5), (3 * dim + 1, f32::from_bits(stored[3 * dim + 1].to_bits() ^ 1))] {
            let mut edited = stored.clone();
            edited[at] = value;
            assert!(SinusoidTable::recognize(&edited, rows, dim).is_none(), "value {at} edited");
        }
        assert!(SinusoidTable::recognize(&stored[dim..], rows - 1, dim).is_none(), "rows shifted by one");
        assert!(SinusoidTable::recognize(&stored, rows, dim + 1).is_none());
        assert!(SinusoidTable::recognize(&stored, 0, dim).is_none());
        assert!(SinusoidTable::recognize(&[], 0, 0).is_none());
    }

    /// The table zh-en's converter stored (through transformers' MarianMTModel, numpy in
    /// float64) is the one generated here, bit for bit. Skipped without the model
    /// (`TOLK_MODELS`, else `models/` or `../shared/models`).
    #[test]
    fn zh_en_stored_table_is_recognized() {
        let roots = [std::env::var_os("TOLK_MODELS").map(std::path::PathBuf::from), Some("models".into()), Some("../shared/models".into())];
        let Some(path) = roots.into_iter().flatten().map(|r| r.join("zh-en-ct2/model.bin")).find(|p| p.is_file()) else {
            eprintln!("zh-en-ct2 not found: skipped");
            return;
        };
        let bin = crate::format::ct2::ModelBin::open(&path).unwrap();
        let stored = bin.tensor("decoder/position_encodings/encodings").unwrap();
        assert_eq!(stored.shape(), [2048, 512]);
        let table = SinusoidTable::recognize(&stored, 2048, 512).expect("zh-en's stored sinusoids are recognized");
        assert_eq!(table.row(2047), stored.row(2047));
    }

    #[test]
    #[should_panic(expected = "past the table")]
    fn rows_past_the_table_are_refused() {
        let stored = hugging_face_table(3, 4);
        SinusoidTable::recognize(&stored, 3, 4).unwrap().row(3);
    }
}
