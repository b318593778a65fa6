//! Plain tables as kubectl prints them: upper-case headers, columns three spaces apart, no
//! trailing blanks. Widths count characters, not the colour codes around a cell.

use super::style::{Style, Tone};

/// One cell: its text and, optionally, what it means.
#[derive(Clone, Debug)]
pub struct Cell {
    text: String,
    tone: Option<Tone>,
}

impl Cell {
    /// A cell with a tone.
    pub fn toned(text: impl Into<String>, tone: Tone) -> Cell {
        Cell {
            text: text.into(),
            tone: Some(tone),
        }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell { text, tone: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::from(text.to_string())
    }
}

/// A table being built.
#[derive(Debug)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<Cell>>,
    indent: usize,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            indent: 0,
        }
    }

    /// Every line starts with `n` spaces.
    pub fn indent(mut self, n: usize) -> Table {
        self.indent = n;
        self
    }

    /// Adds a row (missing cells are empty).
    pub fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    /// The table, one line per row after the headers, each ending in a newline.
    pub fn render(&self, style: Style) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, c) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(c.text.chars().count());
            }
        }
        let header: Vec<Cell> = self.headers.iter().map(|h| Cell::from(h.as_str())).collect();
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = " ".repeat(self.indent);
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i);
                let text = cell.map_or("", |c| c.text.as_str());
                let painted = match cell.and_then(|c| c.tone) {
                    Some(tone) => style.paint(tone, text),
                    None => text.to_string(),
                };
                line.push_str(&painted);
                if i + 1 < columns {
                    line.push_str(&" ".repeat(width - text.chars().count() + 3));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_without_trailing_blanks_and_colour_does_not_shift_them() {
        let mut t = Table::new(&["NODE", "STATE", "NOTE"]);
        t.row(vec![
            "h100-hot".into(),
            Cell::toned("drifted", Tone::Bad),
            "".into(),
        ]);
        t.row(vec!["a".into(), Cell::toned("ok", Tone::Good), "x".into()]);
        let plain = t.render(Style::plain());
        assert_eq!(
            plain,
            "NODE       STATE     NOTE\nh100-hot   drifted\na          ok        x\n"
        );
        let colored = t.render(Style::colored());
        let stripped = colored
            .replace("\x1b[31m", "")
            .replace("\x1b[32m", "")
            .replace("\x1b[0m", "");
        assert_eq!(stripped, plain);
    }
}
