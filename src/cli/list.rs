//! `kamal-proxy list`: upstream's ANSI table, or `--json`.

use clap::Args;

use crate::control::{ListResponse, Request, Response};

#[derive(Args, Debug)]
pub struct ListCmd {
    /// `list` takes no arguments; collected only to refuse them as upstream does.
    #[arg(hide = true)]
    args: Vec<String>,
    /// Print the services as JSON: {"services": {"<name>": {...}}}
    #[arg(long)]
    json: bool,
}

impl ListCmd {
    pub fn execute(&self) -> Result<(), String> {
        if let Some(arg) = self.args.first() {
            return Err(format!(
                "unknown command \"{arg}\" for \"kamal-proxy list\""
            ));
        }
        let list = match super::call(Request::List)? {
            Response::List(l) => l,
            _ => return Err("unexpected reply from the server".into()),
        };
        if self.json {
            println!(
                "{}",
                serde_json::to_string(&list).map_err(|e| e.to_string())?
            );
        } else {
            print!("{}", render_table(&list));
        }
        Ok(())
    }
}

const HEADER_STYLE: &str = "3;94";
const FIRST_COLUMN_STYLE: &str = "1;34";

/// Upstream's table: every cell styled with ANSI escapes (TTY or not), padded to the
/// column width, each followed by two spaces.
/// Control characters escaped (`\u{1b}` for ESC), so nothing a deploy stored can drive
/// the terminal that prints the table.
fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The State column: a frozen or sleeping service also says for how long (`sleeping
/// 2h5m`), in Go's duration style, whole seconds. Kamal never reads `list`.
fn state_cell(d: &crate::control::ServiceDescription) -> String {
    let state = printable(&d.state);
    match d.asleep_seconds {
        Some(secs) if d.state == "frozen" || d.state == "sleeping" => {
            let secs = i64::try_from(secs).unwrap_or(i64::MAX / 1_000_000_000);
            format!("{state} {}", crate::gotime::GoDuration::from_secs(secs))
        }
        _ => state,
    }
}

/// The active targets, as upstream; a rollout pool, when there is one, follows them.
fn target_cell(d: &crate::control::ServiceDescription) -> String {
    if d.rollout_targets.is_empty() {
        return d.target.clone();
    }
    // `rollout_targets` holds the readers too (as the fork's, and as `target` does).
    format!("{} (rollout: {})", d.target, d.rollout_targets.join(","))
}

pub fn render_table(list: &ListResponse) -> String {
    let header = ["Service", "Host", "Path", "Target", "State", "TLS"].map(String::from);
    let rows: Vec<[String; 6]> = list
        .services
        .iter()
        .map(|(name, d)| {
            [
                printable(name),
                printable(&d.host),
                printable(&d.path),
                printable(&target_cell(d)),
                state_cell(d),
                if d.tls { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String; 6], header_row: bool| {
        for (i, cell) in cells.iter().enumerate() {
            let style = match (header_row, i) {
                (true, _) => HEADER_STYLE,
                (false, 0) => FIRST_COLUMN_STYLE,
                _ => "",
            };
            out.push_str(&format!("\x1b[{style}m{cell}\x1b[0m"));
            out.push_str(&" ".repeat(widths[i] - cell.len() + 2));
        }
        out.push('\n');
    };
    line(&header, true);
    for row in &rows {
        line(row, false);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("app.test"), "app.test");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
    }
}
