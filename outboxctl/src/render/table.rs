//! A plain-text table: columns padded to their widest cell, two spaces apart, no borders, so the
//! output reads well in a terminal and still splits on whitespace in a pipe.
//!
//! Widths count characters, not bytes, so a subject with non-ASCII letters does not push its row
//! out of line. The last column is never padded: no trailing spaces.

#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Gap between columns.
const GAP: &str = "  ";

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are ignored.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let columns = self.header.len();
        let cell = |row: &[String], i: usize| row.get(i).map_or("", |c| c.as_str()).to_owned();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, i).chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let text = cell(row, i);
                line.push_str(&text);
                if i + 1 < columns {
                    let pad = width.saturating_sub(text.chars().count());
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(GAP);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Cuts text to `max` characters with an ellipsis, for free-text columns like subjects.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_by_character_width() {
        let mut table = Table::new(&["ID", "STATUS", "SUBJECT"]);
        table.row(vec!["a".into(), "parked".into(), "Überdruck".into()]);
        table.row(vec!["bbbb".into(), "ok".into(), "x".into()]);
        assert_eq!(
            table.render(),
            "ID    STATUS  SUBJECT\n\
             a     parked  Überdruck\n\
             bbbb  ok      x\n"
        );
    }

    #[test]
    fn short_rows_and_empty_last_cells_leave_no_trailing_space() {
        let mut table = Table::new(&["A", "B"]);
        table.row(vec!["x".into()]);
        assert_eq!(table.render(), "A  B\nx\n");
    }

    #[test]
    fn truncates_with_an_ellipsis() {
        assert_eq!(truncate("Tank 4 high level", 8), "Tank 4 …");
        assert_eq!(truncate("short", 8), "short");
    }
}
