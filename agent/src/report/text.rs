//! The summary as text, in the spirit of `perf report --stdio`'s head.

use std::fmt::Write as _;

use super::{FunctionShare, Summary};

/// Names come from the profiled programs' own symbol tables: a control
/// character in one must not reach the terminal as an escape sequence.
pub fn strip_control(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn percent(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        // Sample counts stay far below 2^52, where f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let share = part as f64 * 100.0 / whole as f64;
        share
    }
}

fn function_column(share: &FunctionShare) -> String {
    let function = &share.function;
    let mut column = strip_control(&function.name);
    if function.kernel {
        column.push_str(" [kernel]");
    } else if !function.object.is_empty() && !function.name.starts_with('[') {
        let _ = write!(column, "  ({})", strip_control(&function.object));
    }
    column
}

/// The header and the `top` hottest functions, one per line, each at most
/// `width` columns (`None`: no limit). Plain text, no control characters.
pub fn render_summary(summary: &Summary, top: usize, width: Option<usize>) -> String {
    let mut text = String::new();
    let unit = if summary.unit.is_empty() {
        "samples"
    } else {
        summary.unit.as_str()
    };
    let _ = writeln!(
        text,
        "# {} {}, {} process{}",
        summary.total,
        strip_control(unit),
        summary.processes,
        if summary.processes == 1 { "" } else { "es" }
    );
    if summary.total == 0 {
        text.push_str("# no samples\n");
        return text;
    }
    text.push_str("#   Total     Self  Function\n");
    for share in summary.functions.iter().take(top) {
        let mut line = format!(
            "  {:6.2}%  {:6.2}%  {}",
            percent(share.total_count, summary.total),
            percent(share.self_count, summary.total),
            function_column(share)
        );
        if let Some(width) = width
            && line.chars().count() > width
        {
            line = line.chars().take(width).collect();
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}
