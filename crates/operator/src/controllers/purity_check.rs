//! The project's own import check (issue 25): decide modules import only pure modules.
//!
//! A decide module is every file named `decide.rs` or under a `decide/` folder in
//! `src/controllers`. A module is I/O when its code (comments, string literals and
//! `#[cfg(test)]` items left out) uses `kube::Api`, `kube::Client`, the operator's `Context`
//! (`…::context::Context`), `reqwest`, `tokio` or an `async fn`, or imports an I/O module
//! (transitively). Imports are the
//! `use super::…`/`use crate::…`/`use self::…` statements (grouped and multi-line ones too,
//! and paths relative to a child module) and such paths written out in code, each resolved to
//! the file of the longest module path it names. The check fails naming the decide module,
//! the import and why the imported module is I/O.

use std::collections::{BTreeMap, BTreeSet};

/// Decide modules not held to the rule (their violations are printed, not failed): none.
const ALLOWED: &[&str] = &[];

/// A source file reduced to what the check reads.
struct Module {
    /// Crate-internal imports: (module file, the path as written).
    imports: Vec<(String, String)>,
    /// Why the module is I/O by itself, if it is.
    marker: Option<String>,
}

/// Runs the check over `files` (path relative to `src/` → text); the decide modules in
/// `allowed` are reported on stdout only. `Ok`: how many decide modules were checked; `Err`:
/// one line per violation.
pub fn check(files: &BTreeMap<String, String>, allowed: &[&str]) -> Result<usize, String> {
    let modules: BTreeMap<String, Module> = files
        .iter()
        .map(|(path, text)| (path.clone(), parse(path, text, files)))
        .collect();
    let io = io_modules(&modules);
    let mut decide_modules = 0;
    let mut violations = Vec::new();
    for (path, module) in modules.iter().filter(|(p, _)| is_decide(p)) {
        decide_modules += 1;
        let mut found = Vec::new();
        if let Some(marker) = &module.marker {
            found.push(format!("decide module {path} is I/O itself: {marker}"));
        }
        for (imported, written) in &module.imports {
            if let Some(why) = io.get(imported) {
                found.push(format!(
                    "decide module {path} imports I/O module {imported} (`{written}`): {why}"
                ));
            }
        }
        if allowed.contains(&path.as_str()) {
            for violation in found {
                println!("allowed for now: {violation}");
            }
        } else {
            violations.extend(found);
        }
    }
    violations.sort();
    violations.dedup();
    if violations.is_empty() {
        Ok(decide_modules)
    } else {
        Err(violations.join("\n"))
    }
}

fn is_decide(path: &str) -> bool {
    path.starts_with("controllers/") && (path.ends_with("/decide.rs") || path.contains("/decide/"))
}

/// Every I/O module with the reason: its own marker, or the first I/O module it imports.
fn io_modules(modules: &BTreeMap<String, Module>) -> BTreeMap<String, String> {
    let mut io: BTreeMap<String, String> = modules
        .iter()
        .filter_map(|(p, m)| Some((p.clone(), m.marker.clone()?)))
        .collect();
    loop {
        let mut found = Vec::new();
        for (path, module) in modules.iter().filter(|(p, _)| !io.contains_key(*p)) {
            if let Some((imported, written)) =
                module.imports.iter().find(|(i, _)| io.contains_key(i))
            {
                found.push((
                    path.clone(),
                    format!("it imports I/O module {imported} (`{written}`)"),
                ));
            }
        }
        if found.is_empty() {
            return io;
        }
        io.extend(found);
    }
}

fn parse(path: &str, text: &str, files: &BTreeMap<String, String>) -> Module {
    let code = without_test_items(&strip_comments_and_strings(text));
    let here = module_path(path);
    let (uses, rest) = split_uses(&code);
    let mut imports = Vec::new();
    let mut external = Vec::new();
    for tree in &uses {
        for segments in expand(tree) {
            match resolve(&here, &segments, files) {
                Some(file) if file != path => imports.push((file, segments.join("::"))),
                Some(_) => {}
                None => external.push(segments.join("::")),
            }
        }
    }
    for segments in inline_paths(&rest) {
        if let Some(file) = resolve(&here, &segments, files).filter(|f| f != path) {
            imports.push((file, segments.join("::")));
        }
    }
    let uses_context = imports
        .iter()
        .any(|(_, written)| written.ends_with("context::Context"));
    let marker =
        io_marker(&rest, &external).or_else(|| uses_context.then(|| "uses `Context`".to_string()));
    Module { imports, marker }
}

/// Why code is I/O by itself (`external`: its `use` paths into other crates).
fn io_marker(code: &str, external: &[String]) -> Option<String> {
    for wanted in [
        "kube::Api",
        "kube::Client",
        "kube::api::Api",
        "kube::client::Client",
    ] {
        if external.iter().any(|e| e == wanted) || contains_path(code, wanted) {
            return Some(format!("uses `{wanted}`"));
        }
    }
    for root in ["tokio", "reqwest"] {
        if external
            .iter()
            .any(|e| e == root || e.starts_with(&format!("{root}::")))
            || contains_path(code, &format!("{root}::"))
        {
            return Some(format!("uses `{root}`"));
        }
    }
    if words(code).windows(2).any(|w| w == ["async", "fn"]) {
        return Some("has an `async fn`".to_string());
    }
    None
}

/// `needle` at a word start in `code` (so `kube::Api` is not found in `mykube::Api`).
fn contains_path(code: &str, needle: &str) -> bool {
    code.match_indices(needle)
        .any(|(i, _)| !code[..i].chars().next_back().is_some_and(is_ident))
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn words(code: &str) -> Vec<&str> {
    code.split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect()
}

/// `controllers/egress/decide.rs` → `[controllers, egress, decide]`; `main.rs` → `[]`;
/// `controllers/mod.rs` → `[controllers]`.
fn module_path(path: &str) -> Vec<String> {
    let trimmed = path.trim_end_matches(".rs");
    let mut segments: Vec<String> = trimmed.split('/').map(str::to_string).collect();
    if matches!(
        segments.last().map(String::as_str),
        Some("mod" | "main" | "lib")
    ) {
        segments.pop();
    }
    segments
}

/// The file of a module path, if the crate has one.
fn file_of(module: &[String], files: &BTreeMap<String, String>) -> Option<String> {
    if module.is_empty() {
        return ["main.rs", "lib.rs"]
            .into_iter()
            .find(|f| files.contains_key(*f))
            .map(str::to_string);
    }
    let base = module.join("/");
    [format!("{base}.rs"), format!("{base}/mod.rs")]
        .into_iter()
        .find(|f| files.contains_key(f))
}

/// The module file a path used in module `here` names: the longest module prefix that has
/// a file. `None` for other crates' paths.
fn resolve(
    here: &[String],
    segments: &[String],
    files: &BTreeMap<String, String>,
) -> Option<String> {
    let (mut base, rest): (Vec<String>, &[String]) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (here.to_vec(), &segments[1..]),
        "super" => {
            let supers = segments.iter().take_while(|s| *s == "super").count();
            let keep = here.len().checked_sub(supers)?;
            (here[..keep].to_vec(), &segments[supers..])
        }
        // A child module of this one (a path relative to the current module).
        first => {
            let mut child = here.to_vec();
            child.push(first.to_string());
            file_of(&child, files)?;
            (here.to_vec(), segments)
        }
    };
    let mut found = file_of(&base, files);
    for segment in rest {
        base.push(segment.clone());
        match file_of(&base, files) {
            Some(file) => found = Some(file),
            None => break,
        }
    }
    found
}

/// The `use` trees of `code` (text after `use` up to `;`) and the code without them.
fn split_uses(code: &str) -> (Vec<String>, String) {
    let mut uses = Vec::new();
    let mut rest = String::new();
    let mut i = 0;
    while let Some(offset) = code[i..].find("use") {
        let at = i + offset;
        let before = code[..at].chars().next_back();
        let after = code[at + 3..].chars().next();
        let is_keyword = !before.is_some_and(is_ident) && after.is_some_and(char::is_whitespace);
        let end = code[at..].find(';').map(|e| at + e);
        match (is_keyword, end) {
            (true, Some(end)) => {
                rest.push_str(&code[i..at]);
                uses.push(normalized(&code[at + 3..end]));
                i = end + 1;
            }
            _ => {
                rest.push_str(&code[i..at + 3]);
                i = at + 3;
            }
        }
    }
    rest.push_str(&code[i..]);
    (uses, rest)
}

/// A `use` tree without whitespace, except one space between two words (`a as b`).
fn normalized(tree: &str) -> String {
    let mut out = String::new();
    let mut pending_space = false;
    for c in tree.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space && is_ident(c) && out.chars().next_back().is_some_and(is_ident) {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

/// The paths of a (normalized) `use` tree: `a::{b, c::{d as e, self}, *}` →
/// `a::b`, `a::c::d`, `a::c`, `a`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    expand_into(&[], tree, &mut out);
    out
}

fn expand_into(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = split_path(tree[..open].trim_end_matches("::"));
        let mut path = prefix.to_vec();
        path.extend(head);
        let inner = tree[open + 1..]
            .strip_suffix('}')
            .unwrap_or(&tree[open + 1..]);
        for part in split_top_level(inner) {
            expand_into(&path, part, out);
        }
        return;
    }
    let tree = tree.split(" as ").next().unwrap_or(tree);
    let mut path = prefix.to_vec();
    for segment in split_path(tree) {
        if segment != "self" && segment != "*" {
            path.push(segment);
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}

fn split_path(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top_level(inner: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// Paths starting with `crate::`, `super::` or `self::` written out in code.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            if code[..at].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| is_ident(*c) || *c == ':')
                .collect();
            out.push(split_path(&path));
        }
    }
    out
}

/// Comments removed and string/char literals emptied (so neither counts as code).
fn strip_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i);
            out.push(' ');
        } else if c == '"' || (c == 'r' && !prev_ident(&chars, i) && is_raw_string(&chars, i)) {
            i = skip_string(&chars, i);
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&chars, i) {
            i = skip_char(&chars, i);
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `r"…"` or `r#"…"#` at `i` (not a raw identifier like `r#type`).
fn is_raw_string(chars: &[char], i: usize) -> bool {
    let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
    chars.get(i + 1 + hashes) == Some(&'"')
}

fn prev_ident(chars: &[char], i: usize) -> bool {
    i > 0 && is_ident(chars[i - 1])
}

fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Skips `"…"`, `r"…"` or `r#"…"#` starting at `i`; returns the index after it.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    let raw = chars[i] == 'r';
    if raw {
        i += 1;
    }
    let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
    i += hashes + 1; // the opening quote
    while i < chars.len() {
        if !raw && chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|c| *c == '#') {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// A char literal (`'a'`, `'\n'`, `'\''`) rather than a lifetime (`'a`).
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

fn skip_char(chars: &[char], mut i: usize) -> usize {
    i += 1;
    if chars.get(i) == Some(&'\\') {
        i += 2;
    } else {
        i += 1;
    }
    while i < chars.len() && chars[i] != '\'' {
        i += 1;
    }
    i + 1
}

/// `code` without the items under `#[cfg(test)]` (test modules may import anything).
fn without_test_items(code: &str) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(ATTRIBUTE) {
        out.push_str(&rest[..at]);
        rest = skip_item(&rest[at + ATTRIBUTE.len()..]);
    }
    out.push_str(rest);
    out
}

/// The text after the item that starts `text` (up to its `;`, or its balanced `{…}`).
fn skip_item(text: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            ';' if depth == 0 => return &text[i + 1..],
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &text[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// Every `.rs` file under `dir`, by path relative to it.
fn read_tree(dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = std::fs::read_dir(&current).expect("a readable source directory");
        for entry in entries.map(|e| e.expect("a directory entry").path()) {
            if entry.is_dir() {
                pending.push(entry);
            } else if entry.extension().is_some_and(|e| e == "rs") {
                let relative = entry.strip_prefix(dir).expect("under the source directory");
                let text = std::fs::read_to_string(&entry).expect("a readable source file");
                files.insert(relative.to_string_lossy().replace('\\', "/"), text);
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(decide: &str) -> BTreeMap<String, String> {
        BTreeMap::from(
            [
                ("main.rs", "mod controllers;"),
                (
                    "controllers/mod.rs",
                    "pub mod decide; pub mod kube_io; pub mod status; pub mod wrapper;",
                ),
                (
                    "controllers/kube_io.rs",
                    "use kube::{Api, ResourceExt};\npub async fn get(api: &Api<X>) {}",
                ),
                (
                    "controllers/status.rs",
                    "//! Pure: mentions kube::Api and async fn only in comments.\npub struct Problem; const S: &str = \"tokio::spawn\";",
                ),
                (
                    "controllers/wrapper.rs",
                    "pub use super::kube_io::get;\npub struct Pure;",
                ),
                ("controllers/decide.rs", decide),
            ]
            .map(|(p, t)| (p.to_string(), t.to_string())),
        )
    }

    /// The demonstration: a decide module importing `kube_io` (grouped, over two lines)
    /// fails, naming the module and the import.
    #[test]
    fn a_decide_module_importing_kube_io_fails_with_its_name() {
        let files = fixture("use super::{\n    status::Problem,\n    kube_io::get,\n};");
        let error = check(&files, &[]).expect_err("kube_io is I/O");
        println!("{error}");
        assert!(
            error.contains("decide module controllers/decide.rs imports I/O module controllers/kube_io.rs (`super::kube_io::get`): uses `kube::Api`"),
            "{error}"
        );
        // Only the pure import: fine (comments and strings do not count).
        let files = fixture("use super::status::Problem;\nuse crate::controllers::status;");
        assert_eq!(check(&files, &[]), Ok(1));
    }

    #[test]
    fn io_is_transitive_and_inline_paths_and_test_items_count_as_they_should() {
        // Through a pure-looking module that re-exports I/O.
        let files = fixture("use crate::controllers::wrapper::Pure;");
        let error = check(&files, &[]).expect_err("wrapper imports kube_io");
        assert!(
            error.contains("controllers/wrapper.rs (`crate::controllers::wrapper::Pure`): it imports I/O module controllers/kube_io.rs"),
            "{error}"
        );
        // A path written out in code.
        let files = fixture("fn f() { super::kube_io::get(); }");
        assert!(check(&files, &[]).is_err());
        // Test items may import anything; an allowed pair is not reported.
        let files = fixture("#[cfg(test)]\nmod tests { use super::super::kube_io::get; }");
        assert_eq!(check(&files, &[]), Ok(1));
        let files = fixture("use super::kube_io::get;");
        assert_eq!(check(&files, &["controllers/decide.rs"]), Ok(1));
        // A decide module with I/O of its own.
        let files = fixture("pub async fn decide() {}");
        assert!(check(&files, &[]).is_err_and(|e| e.contains("is I/O itself")));
    }

    #[test]
    fn use_trees_expand() {
        let tree = normalized(
            " super::super::{\n  agent::{decide::{self, Decide}, identity as id},\n  status::*,\n}",
        );
        let paths = expand(&tree);
        let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(
            joined,
            [
                "super::super::agent::decide",
                "super::super::agent::decide::Decide",
                "super::super::agent::identity",
                "super::super::status",
            ]
        );
    }

    /// The real egress decide with one more import of `kube_io` fails, naming both.
    #[test]
    fn the_egress_decide_importing_kube_io_fails() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = read_tree(&src);
        let decide = files
            .get_mut("controllers/egress/decide.rs")
            .expect("the egress decide module");
        decide.insert_str(0, "use super::super::kube_io::{apply_cached, Watched};\n");
        let error = check(&files, ALLOWED).expect_err("kube_io is I/O");
        println!("{error}");
        assert!(
            error.contains("decide module controllers/egress/decide.rs imports I/O module controllers/kube_io.rs (`super::super::kube_io::apply_cached`)"),
            "{error}"
        );
    }

    /// The operator's decide modules import only pure modules.
    #[test]
    fn decide_modules_import_only_pure_modules() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let files = read_tree(&src);
        let checked = check(&files, ALLOWED).unwrap_or_else(|e| panic!("{e}"));
        // egress, ingress, agent and tailnet: the scan found them (not vacuous).
        assert!(checked >= 4, "only {checked} decide modules found");
        let modules: BTreeSet<&str> = files.keys().map(String::as_str).collect();
        for decide in [
            "controllers/agent/decide.rs",
            "controllers/egress/decide.rs",
            "controllers/ingress/decide.rs",
        ] {
            assert!(modules.contains(decide), "{decide}");
        }
    }
}
