//! The quick start as a script: the marked blocks of `docs/quick-start.md`, extracted and run
//! in order, as a user pasting them into a shell would.
//!
//! The convention (also stated in a comment of the doc): a line `<!-- quick-start: KIND -->`
//! right before a fenced block marks it.
//!
//! - `settings`: the one block a user adapts (`export NAME=value` lines). The runner never runs
//!   it; it runs the settings it is given instead (the lab's values), and
//!   [`settings_names`] lets a test check that both set the same variables.
//! - `run`: a shell block, run as written with `bash -euo pipefail` in the run's directory,
//!   the settings first (each block in its own bash, so only the settings and the files
//!   carry over, as with `export`ed variables in one terminal).
//! - `file NAME`: the block's text is written to `NAME` in that directory.
//!
//! Unmarked blocks are illustrations and never run. A marker without a fenced block right
//! after it, or an unknown kind, is an error: a typo must not silently drop a block.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// What a marked block is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockKind {
    Settings,
    Run,
    File(String),
}

/// One marked block of the doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub kind: BlockKind,
    /// 1-based line of the block's first content line in the doc.
    pub line: usize,
    /// The block's content (without the fences), ending with a newline.
    pub text: String,
}

impl Block {
    /// `block N (docs/quick-start.md:LINE, KIND)` for messages.
    pub fn describe(&self, index: usize, doc_name: &str) -> String {
        let kind = match &self.kind {
            BlockKind::Settings => "settings".to_string(),
            BlockKind::Run => "run".to_string(),
            BlockKind::File(name) => format!("file {name}"),
        };
        format!("block {} ({doc_name}:{}, {kind})", index + 1, self.line)
    }
}

const MARKER_PREFIX: &str = "<!-- quick-start:";

/// The marked blocks of `doc`, in order. Errors name the line of a marker that is unknown or
/// not followed by a fenced block, and of a fence that is never closed.
pub fn extract(doc: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut blocks = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index].trim();
        index += 1;
        let Some(rest) = line.strip_prefix(MARKER_PREFIX) else {
            continue;
        };
        let marker_line = index;
        let kind = rest
            .strip_suffix("-->")
            .map(str::trim)
            .ok_or_else(|| format!("line {marker_line}: a quick-start marker ends with -->"))?;
        let kind = match kind.split_once(' ') {
            None if kind == "settings" => BlockKind::Settings,
            None if kind == "run" => BlockKind::Run,
            Some(("file", name)) if !name.trim().is_empty() && !name.contains('/') => {
                BlockKind::File(name.trim().to_string())
            }
            _ => {
                return Err(format!(
                    "line {marker_line}: unknown quick-start marker {kind:?} (settings, run, file NAME)"
                ));
            }
        };
        let fence = lines.get(index).map(|l| l.trim_end()).unwrap_or_default();
        if !fence.starts_with("```") {
            return Err(format!(
                "line {marker_line}: the quick-start marker is not followed by a fenced block"
            ));
        }
        let start = index + 1;
        let end = lines[start..]
            .iter()
            .position(|l| l.trim_end() == "```")
            .map(|offset| start + offset)
            .ok_or_else(|| format!("line {}: the fenced block is never closed", start))?;
        let mut text = lines[start..end].join("\n");
        text.push('\n');
        blocks.push(Block {
            kind,
            line: start + 1,
            text,
        });
        index = end + 1;
    }
    Ok(blocks)
}

/// The variables a settings block sets: the `NAME` of each `export NAME=…` line.
pub fn settings_names(settings: &str) -> Vec<String> {
    settings
        .lines()
        .filter_map(|line| line.trim().strip_prefix("export "))
        .filter_map(|rest| {
            rest.split_once('=')
                .map(|(name, _)| name.trim().to_string())
        })
        .collect()
}

/// The value a settings block gives `name` (`export NAME=value  # comment`), unquoted.
pub fn settings_value(settings: &str, name: &str) -> Option<String> {
    settings.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("export ")?;
        let (key, value) = rest.split_once('=')?;
        (key.trim() == name).then(|| {
            let value = value.split(" #").next().unwrap_or_default().trim();
            value.trim_matches(|c| c == '"' || c == '\'').to_string()
        })
    })
}

/// How to run the blocks.
#[derive(Debug, Clone)]
pub struct Runner {
    /// Where the blocks run and the files are written.
    pub dir: PathBuf,
    /// The settings the run blocks start with, instead of the doc's (shell: `export NAME=…`).
    pub settings: String,
    /// Extra environment of every block (e.g. `PATH`, `KUBECONFIG`).
    pub env: Vec<(String, String)>,
    /// For messages: the doc's path as the user knows it.
    pub doc_name: String,
}

/// `'value'` for a shell (single quotes, `'` escaped).
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

impl Runner {
    /// Runs `blocks` in order, printing each block and its output as it runs. Stops at the
    /// first failure; the error names the block (number, line, kind) and shows its text and
    /// the last lines of its output.
    pub fn run(&self, blocks: &[Block]) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
        for (index, block) in blocks.iter().enumerate() {
            let name = block.describe(index, &self.doc_name);
            match &block.kind {
                BlockKind::Settings => {
                    eprintln!("==== quick start {name}: replaced by\n{}", self.settings);
                }
                BlockKind::File(file) => {
                    eprintln!("==== quick start {name}\n{}", block.text);
                    let path = self.dir.join(file);
                    std::fs::write(&path, &block.text)
                        .map_err(|e| format!("{name}: writing {}: {e}", path.display()))?;
                }
                BlockKind::Run => self.run_block(index, &name, block)?,
            }
        }
        Ok(())
    }

    fn run_block(&self, index: usize, name: &str, block: &Block) -> Result<(), String> {
        eprintln!("==== quick start {name}\n{}", block.text);
        let script = self
            .dir
            .join(format!(".quick-start-block-{}.sh", index + 1));
        // stderr into stdout: one stream, in order, for the transcript.
        let text = format!(
            "exec 2>&1\n# settings\n{}\n# {name}\n{}",
            self.settings, block.text
        );
        std::fs::write(&script, text).map_err(|e| format!("{}: {e}", script.display()))?;
        let started = Instant::now();
        let mut child = Command::new("bash")
            .args(["-euo", "pipefail"])
            .arg(&script)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name}: running bash: {e}"))?;
        let mut output = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let line = line.unwrap_or_else(|e| format!("<unreadable output: {e}>"));
                eprintln!("  | {line}");
                output.push(line);
            }
        }
        let status = child.wait().map_err(|e| format!("{name}: {e}"))?;
        eprintln!("==== {name}: {status} after {:.1?}", started.elapsed());
        if status.success() {
            return Ok(());
        }
        let tail = output[output.len().saturating_sub(40)..].join("\n");
        Err(format!(
            "quick start {name} failed ({status}):\n{}--- its last output lines ---\n{tail}",
            block.text
        ))
    }
}

/// The doc, its blocks and its settings block; errors if there is not exactly one settings
/// block.
pub fn read(path: &Path) -> Result<(Vec<Block>, Block), String> {
    let doc =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let blocks = extract(&doc).map_err(|e| format!("{}: {e}", path.display()))?;
    let settings: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.kind == BlockKind::Settings)
        .collect();
    match settings.as_slice() {
        [one] => {
            let one = (*one).clone();
            Ok((blocks, one))
        }
        _ => Err(format!(
            "{}: {} quick-start settings blocks, expected exactly one",
            path.display(),
            settings.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Title\n\nSome text.\n\n<!-- quick-start: settings -->\n```sh\n\
export GREETING=hello   # what to say\nexport NAME='the doc'\n```\n\n```sh\necho not marked\n```\n\n\
<!-- quick-start: file note.txt -->\n```text\nfirst line\n```\n\n\
<!-- quick-start: run -->\n```sh\necho \"$GREETING $NAME\" > said.txt\ncat note.txt >> said.txt\n```\n";

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tno-quick-start-unit-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn runner(dir: &Path, settings: &str) -> Runner {
        Runner {
            dir: dir.to_path_buf(),
            settings: settings.to_string(),
            env: Vec::new(),
            doc_name: "doc.md".into(),
        }
    }

    #[test]
    fn extracts_marked_blocks_only_in_order() {
        let blocks = extract(DOC).expect("blocks");
        let kinds: Vec<&BlockKind> = blocks.iter().map(|b| &b.kind).collect();
        assert_eq!(
            kinds,
            [
                &BlockKind::Settings,
                &BlockKind::File("note.txt".into()),
                &BlockKind::Run
            ]
        );
        assert_eq!(blocks[0].line, 7);
        assert_eq!(blocks[1].text, "first line\n");
        assert!(blocks[2].text.starts_with("echo \"$GREETING"));
        assert_eq!(settings_names(&blocks[0].text), ["GREETING", "NAME"]);
        assert_eq!(
            settings_value(&blocks[0].text, "GREETING").as_deref(),
            Some("hello")
        );
        assert_eq!(
            settings_value(&blocks[0].text, "NAME").as_deref(),
            Some("the doc")
        );
    }

    #[test]
    fn bad_markers_are_errors_not_skipped_blocks() {
        let unknown = extract("<!-- quick-start: runn -->\n```sh\ntrue\n```\n").unwrap_err();
        assert!(
            unknown.contains("line 1") && unknown.contains("runn"),
            "{unknown}"
        );
        let no_fence = extract("<!-- quick-start: run -->\n\n```sh\ntrue\n```\n").unwrap_err();
        assert!(no_fence.contains("not followed"), "{no_fence}");
        let open = extract("<!-- quick-start: run -->\n```sh\ntrue\n").unwrap_err();
        assert!(open.contains("never closed"), "{open}");
    }

    #[test]
    fn runs_with_the_given_settings_instead_of_the_docs() {
        let dir = scratch("settings");
        let blocks = extract(DOC).expect("blocks");
        runner(&dir, "export GREETING=hi NAME=lab")
            .run(&blocks)
            .expect("the blocks run");
        let said = std::fs::read_to_string(dir.join("said.txt")).expect("said.txt");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(said, "hi lab\nfirst line\n");
    }

    #[test]
    fn a_failing_block_fails_the_run_and_is_named() {
        let dir = scratch("failing");
        let doc = DOC.replace(
            "cat note.txt >> said.txt",
            "echo before the failure\nfalse\necho never printed > after.txt",
        );
        let blocks = extract(&doc).expect("blocks");
        let error = runner(&dir, "export GREETING=hi NAME=lab")
            .run(&blocks)
            .expect_err("a block with `false` fails the run");
        let after = dir.join("after.txt").exists();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(error.contains("block 3 (doc.md:22, run) failed"), "{error}");
        assert!(error.contains("before the failure"), "{error}");
        assert!(!after, "bash -e stops at the failing command");
        // An unset variable (a setting the runner does not provide) fails too (-u).
        let dir = scratch("unset");
        let error = runner(&dir, "export GREETING=hi")
            .run(&extract(DOC).expect("blocks"))
            .expect_err("NAME is unset");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(error.contains("NAME: unbound variable"), "{error}");
    }
}
