//! `config.json` of a CTranslate2 model directory (special tokens and a few options).
use crate::error::{Error, Result};
use crate::format::json::{self, Json};

#[derive(Debug, Clone, PartialEq)]
pub struct Ct2Config {
    pub bos_token: String,
    pub eos_token: String,
    pub unk_token: String,
    /// `None` when the config sets it to null: the first target prefix token starts decoding.
    pub decoder_start_token: Option<String>,
    pub add_source_bos: bool,
    pub add_source_eos: bool,
    /// `None` = CTranslate2's default (1e-5 for LayerNorm, 1e-6 for RMSNorm).
    pub layer_norm_epsilon: Option<f32>,
}

impl Default for Ct2Config {
    /// The values CTranslate2 assumes for models converted before config.json existed.
    fn default() -> Self {
        Ct2Config {
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            unk_token: "<unk>".into(),
            decoder_start_token: Some("<s>".into()),
            add_source_bos: false,
            add_source_eos: false,
            layer_norm_epsilon: None,
        }
    }
}

impl Ct2Config {
    pub fn parse(text: &str) -> Result<Ct2Config> {
        let doc = json::parse(text).map_err(|e| Error::invalid_model(format!("config.json: {e}")))?;
        if !matches!(doc, Json::Object(_)) {
            return Err(Error::invalid_model("config.json: expected a JSON object"));
        }
        let mut cfg = Ct2Config::default();
        let string = |key: &str, dst: &mut String| -> Result<()> {
            match doc.get(key) {
                None | Some(Json::Null) => Ok(()),
                Some(Json::String(s)) => {
                    *dst = s.clone();
                    Ok(())
                }
                Some(_) => Err(Error::invalid_model(format!("config.json: {key:?} must be a string"))),
            }
        };
        string("bos_token", &mut cfg.bos_token)?;
        string("eos_token", &mut cfg.eos_token)?;
        string("unk_token", &mut cfg.unk_token)?;
        match doc.get("decoder_start_token") {
            None => cfg.decoder_start_token = Some(cfg.bos_token.clone()),
            Some(Json::Null) => cfg.decoder_start_token = None,
            Some(Json::String(s)) => cfg.decoder_start_token = Some(s.clone()),
            Some(_) => return Err(Error::invalid_model("config.json: \"decoder_start_token\" must be a string or null")),
        }
        let flag = |key: &str| -> Result<bool> {
            match doc.get(key) {
                None | Some(Json::Null) => Ok(false),
                Some(Json::Bool(b)) => Ok(*b),
                Some(_) => Err(Error::invalid_model(format!("config.json: {key:?} must be a boolean"))),
            }
        };
        cfg.add_source_bos = flag("add_source_bos")?;
        cfg.add_source_eos = flag("add_source_eos")?;
        cfg.layer_norm_epsilon = match doc.get("layer_norm_epsilon") {
            None | Some(Json::Null) => None,
            // As f32 (1e300 would be infinite there, and every norm NaN).
            Some(Json::Number(x)) if (*x as f32).is_finite() && *x >= 0.0 => Some(*x as f32),
            Some(_) => return Err(Error::invalid_model("config.json: \"layer_norm_epsilon\" must be a non-negative float32 number or null")),
        };
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_zh_en_style_config() {
        let cfg = Ct2Config::parse(
            r#"{"add_source_bos": false, "add_source_eos": true, "bos_token": "<s>",
               "decoder_start_token": "<s>", "eos_token": "</s>", "layer_norm_epsilon": null,
               "unk_token": "<unk>"}"#,
        )
        .unwrap();
        assert!(cfg.add_source_eos && !cfg.add_source_bos);
        assert_eq!(cfg.decoder_start_token.as_deref(), Some("<s>"));
        assert_eq!(cfg.layer_norm_epsilon, None);
    }

    #[test]
    fn null_start_token_and_bad_types() {
        let cfg = Ct2Config::parse(r#"{"decoder_start_token": null, "layer_norm_epsilon": 1e-6}"#).unwrap();
        assert_eq!(cfg.decoder_start_token, None);
        assert_eq!(cfg.layer_norm_epsilon, Some(1e-6));
        assert!(Ct2Config::parse(r#"{"add_source_eos": "yes"}"#).is_err());
        assert!(Ct2Config::parse("[1]").is_err());
        assert!(Ct2Config::parse("{").is_err());
    }
}
