//! `config.pbtxt` (protobuf text format with Triton's colon-less lists): accepted text must
//! round-trip through JSON; refused text must be blamed on a line and column inside it.

use tessera_protocol::model_config::{ConfigFormatError, from_pbtxt};

/// Parses `data` as `config.pbtxt`.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match from_pbtxt(text) {
        Ok(config) => super::model_config::check_parsed(&config),
        Err(ConfigFormatError::Text { line, column, .. }) => {
            let lines = text.split('\n').count();
            assert!((1..=lines).contains(&line), "line {line} of {lines}");
            let width = text.split('\n').nth(line - 1).map_or(0, |l| l.chars().count());
            assert!((1..=width + 1).contains(&column), "column {column} of a {width}-character line");
        }
        Err(_) => {}
    }
}
