//! Triton's JSON model config (what `X-Model-Config` and presigned uploads carry): accepted
//! JSON must round-trip through the JSON the server writes.

use tessera_protocol::model_config::from_json;

/// Parses `data` as a JSON model config.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = from_json(text) {
        super::model_config::check_parsed(&config);
    }
}
