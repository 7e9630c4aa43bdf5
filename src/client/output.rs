//! How the client verbs print: `--output table` (the default, for people: aligned columns and
//! `label: value` blocks) or `--output json` (for scripts: the API's own JSON, pretty-printed).
//! Every verb renders through [`Table`] and [`Fields`], so columns line up the same way
//! everywhere.

use serde_json::Value;

/// Output format of the client verbs (`--output`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned tables and `label: value` lines.
    #[default]
    Table,
    /// The API's JSON answer, pretty-printed.
    Json,
}

impl Output {
    /// Whether scripts asked for JSON.
    pub fn is_json(self) -> bool {
        self == Output::Json
    }
}

/// Prints a JSON value, pretty.
pub fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Columns of text: a header row, then rows, each column as wide as its widest cell, two
/// spaces apart; the last column is not padded (no trailing blanks).
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// What an empty cell shows.
pub const NONE: &str = "-";

impl Table {
    /// A table with these column titles.
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        Table::with_header(&header)
    }

    /// A table whose columns are chosen at run time.
    pub fn with_header(header: &[&str]) -> Self {
        Table { header: header.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    /// Adds a row; missing cells show as [`NONE`], extra cells are dropped.
    pub fn row<I, S>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).take(self.header.len()).collect();
        row.resize(self.header.len(), NONE.to_string());
        for cell in &mut row {
            if cell.is_empty() {
                *cell = NONE.to_string();
            }
        }
        self.rows.push(row);
        self
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let last = row.len().saturating_sub(1);
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                out.push_str(cell);
                if i < last {
                    out.push_str(&" ".repeat(width - cell.chars().count() + 2));
                }
            }
            out.push('\n');
        }
        out
    }

    /// Prints the table, or `empty` (e.g. `no deployments in tenant demo`) when it has no rows.
    pub fn print_or(&self, empty: &str) {
        if self.is_empty() {
            println!("{empty}");
        } else {
            print!("{}", self.render());
        }
    }
}

/// `label: value` lines with the values aligned, for one object (`get` verbs).
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pairs: Vec<(String, String)>,
}

impl Fields {
    /// An empty block.
    pub fn new() -> Self {
        Fields::default()
    }

    /// Adds a line; an empty value shows as [`NONE`].
    pub fn add(&mut self, label: &str, value: impl Into<String>) -> &mut Self {
        let value = value.into();
        self.pairs.push((label.to_string(), if value.is_empty() { NONE.to_string() } else { value }));
        self
    }

    /// The text, one line per field.
    pub fn render(&self) -> String {
        let width = self.pairs.iter().map(|(l, _)| l.chars().count() + 1).max().unwrap_or(0);
        let mut out = String::new();
        for (label, value) in &self.pairs {
            out.push_str(&format!("{:<width$}  {value}\n", format!("{label}:")));
        }
        out
    }

    /// Prints the block.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// A JSON value as a cell: strings bare, null as [`NONE`], anything else as JSON.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => NONE.to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An optional value as a cell.
pub fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| NONE.to_string(), |v| v.to_string())
}

/// A byte count for people: `512 B`, `1.5 KiB`, `3.2 MiB`, `1.0 GiB`.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n.abs() < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value.abs() < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// An RFC 3339 time as the API gives it, shortened to the second (`2026-12-02T06:43:14Z`).
pub fn time(rfc3339: &str) -> String {
    match rfc3339.split_once('.') {
        // Fractional seconds, then `Z` or an offset.
        Some((whole, rest)) => {
            let zone = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{whole}{zone}")
        }
        None => rfc3339.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_the_widest_cell_and_the_last_is_not_padded() {
        let mut t = Table::new(["NAME", "VERSION", "STATE"]);
        t.row(["resnet", "12", "ready"]).row(["a", "1", "progressing"]);
        assert_eq!(t.render(), "NAME    VERSION  STATE\nresnet  12       ready\na       1        progressing\n");
    }

    #[test]
    fn missing_and_empty_cells_show_a_dash_and_extra_cells_are_dropped() {
        let mut t = Table::new(["A", "B", "C"]);
        t.row(["x"]).row(["", "y", "z", "extra"]);
        assert_eq!(t.render(), "A  B  C\nx  -  -\n-  y  z\n");
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let mut t = Table::new(["ALIAS", "ARROW"]);
        t.row(["é", "→"]);
        assert_eq!(t.render(), "ALIAS  ARROW\né      →\n");
    }

    #[test]
    fn an_empty_table_is_only_its_header() {
        let t = Table::new(["ONE"]);
        assert!(t.is_empty());
        assert_eq!(t.render(), "ONE\n");
    }

    #[test]
    fn fields_align_their_values() {
        let mut f = Fields::new();
        f.add("tenant", "demo").add("role", "tenant-admin").add("user", "");
        assert_eq!(f.render(), "tenant:  demo\nrole:    tenant-admin\nuser:    -\n");
    }

    #[test]
    fn cells_from_json() {
        assert_eq!(cell(&serde_json::json!("ready")), "ready");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&serde_json::json!([1, -1])), "[1,-1]");
        assert_eq!(opt(Some(3)), "3");
        assert_eq!(opt::<i64>(None), "-");
    }

    #[test]
    fn sizes_and_times_read_easily() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 + 200_000), "3.2 MiB");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(time("2026-12-02T06:43:14.123456Z"), "2026-12-02T06:43:14Z");
        assert_eq!(time("2026-12-02T06:43:14.5+01:00"), "2026-12-02T06:43:14+01:00");
        assert_eq!(time("2026-12-02T06:43:14Z"), "2026-12-02T06:43:14Z");
    }
}
