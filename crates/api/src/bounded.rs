//! Bounds on text the operator writes into status (condition messages, the
//! `status.contributors[]` lines): a message that could grow with its inputs (a contributor's
//! fragment, the number of resources) is cut on a character boundary, never inside a UTF-8
//! sequence, and says that it was cut.

/// Most bytes of a condition message and of one `status.contributors[]` line (refused entry
/// or error). Longer text is cut and ends with [`CUT_MARK`].
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Appended to text that was cut.
pub const CUT_MARK: &str = " …(cut)";

/// `text` if it has at most `max` bytes; otherwise its longest prefix that ends on a character
/// boundary and leaves room for [`CUT_MARK`], followed by the mark (at most `max` bytes in
/// all, for any `max` ≥ the mark's length).
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(CUT_MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARK}", &text[..end])
}

/// At most `listed` lines, each bounded to [`MAX_MESSAGE_BYTES`]; when lines were left out,
/// a last line `… and K more` says how many.
pub fn bounded_lines(lines: &[String], listed: usize) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .take(listed)
        .map(|line| bounded(line, MAX_MESSAGE_BYTES))
        .collect();
    if lines.len() > listed {
        out.push(format!("… and {} more", lines.len() - listed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_unchanged() {
        assert_eq!(bounded("abc", 10), "abc");
        assert_eq!(bounded("", 0), "");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_within_the_bound() {
        // Multi-byte characters everywhere: every cut position is tried.
        let text = "é→😀a".repeat(200);
        for max in CUT_MARK.len()..text.len() {
            let out = bounded(&text, max);
            assert!(out.len() <= max, "{max}: {} bytes", out.len());
            assert!(out.ends_with(CUT_MARK), "{max}");
            assert!(text.starts_with(out.trim_end_matches(CUT_MARK)), "{max}");
        }
    }

    #[test]
    fn a_bound_smaller_than_the_mark_still_never_splits_a_character() {
        let out = bounded("😀😀😀", 2);
        assert_eq!(out, CUT_MARK);
    }

    #[test]
    fn lines_are_listed_up_to_the_limit_then_counted() {
        let lines: Vec<String> = (0..25).map(|i| format!("entry {i}")).collect();
        let out = bounded_lines(&lines, 20);
        assert_eq!(out.len(), 21);
        assert_eq!(out[19], "entry 19");
        assert_eq!(out[20], "… and 5 more");
        assert_eq!(bounded_lines(&lines[..3], 20).len(), 3);
        let long = vec!["x".repeat(5000)];
        assert!(bounded_lines(&long, 20)[0].len() <= MAX_MESSAGE_BYTES);
    }
}
