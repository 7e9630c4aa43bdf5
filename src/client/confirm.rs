//! Confirmation before a destructive verb (`models delete`, `deployments delete`, `keys
//! revoke`): `--yes` skips it; otherwise a person at a terminal answers `y`, and a script
//! without a terminal is refused, so nothing is deleted by a command run blind.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;

/// Asks `question` (e.g. `delete deployment resnet in tenant demo?`) unless `yes`; fails
/// unless the answer is yes.
pub fn confirm(question: &str, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("{question} not confirmed: pass --yes to do it without asking");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if is_yes(&answer) { Ok(()) } else { bail!("cancelled: nothing was changed") }
}

/// Whether an answer means yes (`y` or `yes`, any case, spaces around ignored).
fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_yes_is_yes() {
        for yes in ["y", "Y", "yes", " YES\n"] {
            assert!(is_yes(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yess", "ok"] {
            assert!(!is_yes(no), "{no:?}");
        }
    }

    #[test]
    fn yes_skips_the_question() {
        assert!(confirm("delete everything?", true).is_ok());
    }
}
