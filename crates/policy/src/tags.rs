//! Tag syntax as Headscale checks it, shared by the renderer and the route planner.

/// Headscale's tag rule (`Tag.Validate`): `tag:` then an ASCII letter. Later characters are
/// not checked here beyond "no whitespace, quotes, ':', '@' or control characters" (Headscale
/// reads any alias containing '@' as a user, so `tag:x@y` would not be a tag).
pub fn valid_tag(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix("tag:") else {
        return false;
    };
    rest.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && !rest
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | ':' | '@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_validity_follows_headscale() {
        assert!(valid_tag("tag:tno-egress-team-a"));
        assert!(valid_tag("tag:A.b-1"));
        for bad in [
            "tag:", "tag:1abc", "tag:-x", "group:x", "tag:a b", "tag:a\"b", "tag:a:b", "tag:a@b",
        ] {
            assert!(!valid_tag(bad), "{bad}");
        }
    }
}
