//! Progress bars and spinners on stderr (hidden when stderr is not a terminal, so scripts
//! and logs see only the final lines).

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

const BYTES_TEMPLATE: &str = "{prefix:>9} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}";
const SPINNER_TEMPLATE: &str = "{spinner} {elapsed:>4} {msg}";

/// A byte-counting bar for `total` bytes, prefixed with `what`.
pub fn bytes(what: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    // A constant template (the unit test below parses it); the fallback is never used.
    let style = ProgressStyle::with_template(BYTES_TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}

/// A spinner with a message, ticking on its own.
pub fn spinner(message: impl Into<String>) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    let style = ProgressStyle::with_template(SPINNER_TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.set_message(message.into());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse() {
        assert!(ProgressStyle::with_template(BYTES_TEMPLATE).is_ok());
        assert!(ProgressStyle::with_template(SPINNER_TEMPLATE).is_ok());
    }
}
