//! The docs hold together: every relative link in the workspace's own Markdown (README.md,
//! docs/, BENCHMARKS.md, deploy/, migrations/, vendor/README.md) names a file or folder that
//! exists, and a link with a `#fragment` names a heading of its target by the anchor GitHub gives
//! it; and every page of docs/ is linked from the README, so none is left where no reader finds
//! it. Links in code (fenced blocks and inline code spans) are text, not links, and are skipped,
//! as are links with a scheme (`https:`, `mailto:`). The vendored crates' own READMEs
//! (`vendor/<crate>/`) are upstream's and not checked.
//!
//! The anchors follow GitHub's rule: the heading's text without its Markdown, lower-cased, every
//! character but letters, digits, `-`, `_` and spaces dropped, each space made a `-`, and a
//! repeated anchor numbered (`-1`, `-2`...) in the order the headings come.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace root.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lies in the workspace")
}

/// Folders never searched for Markdown: build output, the demo's state, and hidden ones (`.git`).
const SKIPPED_DIRS: [&str; 2] = ["target", "var"];

/// The Markdown files under `root` that are the project's own, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            // `file_type` does not follow symbolic links: a `target` linked elsewhere is skipped
            // by name, and no link can lead the walk out of the workspace.
            let kind = entry
                .file_type()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if kind.is_dir() {
                let vendored_crate = dir.file_name().is_some_and(|d| d == "vendor");
                if !name.starts_with('.')
                    && !SKIPPED_DIRS.contains(&name.as_str())
                    && !vendored_crate
                {
                    pending.push(path);
                }
            } else if kind.is_file() && name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// `text` with what Markdown shows as code blanked out (fenced blocks, inline code spans), each
/// character but a line break replaced by a space, so offsets and line numbers stay those of the
/// file.
fn without_code(text: &str) -> String {
    blank_code_spans(&blank_fenced_blocks(text))
}

/// `text` with its fenced code blocks (```` ``` ```` or `~~~`, three or more) blanked, each
/// character but a line break replaced by a space.
fn blank_fenced_blocks(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The opening fence's character and length while inside a block.
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let first = trimmed.chars().next().unwrap_or(' ');
        let run = trimmed.chars().take_while(|c| *c == first).count();
        let is_fence = matches!(first, '`' | '~') && run >= 3;
        let in_code = match fence {
            Some((c, n)) => {
                if is_fence && first == c && run >= n && trimmed[run..].trim().is_empty() {
                    fence = None;
                }
                true
            }
            None if is_fence => {
                fence = Some((first, run));
                true
            }
            None => false,
        };
        if in_code {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Blanks inline code spans: a run of n backticks up to the next run of exactly n (which may be
/// on a later line of the paragraph); a run with no partner is left as it is.
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let run_at = |i: usize| chars[i..].iter().take_while(|c| **c == '`').count();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else if chars[j] == '\n' && chars.get(j + 1) == Some(&'\n') {
                break; // a blank line ends the paragraph, and with it any span
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &chars[i..j + n] {
                    out.push(if *c == '\n' { '\n' } else { ' ' });
                }
                i = j + n;
            }
            None => {
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// A link found in a file: its line (from 1) and its target as written.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The link targets of `text` outside code: inline links and images (`[text](target)`,
/// `![alt](target "title")`) and reference definitions (`[label]: target`).
fn links(text: &str) -> Vec<Link> {
    let visible = without_code(text);
    let line_of = |offset: usize| visible[..offset].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = visible[from..].find("](") {
        let start = from + at + 2;
        let rest = &visible[start..];
        let end = rest.find([')', ' ', '\n', '\t']).unwrap_or(rest.len());
        let target = rest[..end].trim_start_matches('<').trim_end_matches('>');
        if !target.is_empty() {
            found.push(Link {
                line: line_of(start),
                target: target.to_string(),
            });
        }
        from = start;
    }
    let mut offset = 0;
    for line in visible.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find(']')
            && let Some(definition) = trimmed[close + 1..].strip_prefix(':')
            && let Some(target) = definition.split_whitespace().next()
        {
            found.push(Link {
                line: line_of(offset),
                target: target.to_string(),
            });
        }
        offset += line.len();
    }
    found
}

/// The anchors GitHub gives the headings of `text` (ATX headings outside code), and the ids of
/// any HTML anchors it holds.
fn anchors(text: &str) -> BTreeSet<String> {
    // A heading's inline code is part of its anchor, so only the fenced blocks are blanked.
    let visible = blank_fenced_blocks(text);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for line in visible.lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let title = line[hashes..].trim().trim_end_matches('#').trim();
            let base = slug(title);
            let count = seen.entry(base.clone()).or_insert(0);
            let anchor = match *count {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            };
            *count += 1;
            found.insert(anchor);
        }
        for attr in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    found.insert(value[..end].to_string());
                }
                rest = &rest[at + attr.len()..];
            }
        }
    }
    found
}

/// GitHub's anchor for a heading's text: links reduced to their text, then lower case, only
/// letters, digits, `-`, `_` and spaces kept, and each space a `-`.
fn slug(title: &str) -> String {
    let mut text = String::new();
    let mut rest = title;
    // `[text](target)` shows as `text`.
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Whether a link target leaves the workspace's files: a scheme (`https:`, `mailto:`) or a
/// protocol-relative `//host`.
fn is_external(target: &str) -> bool {
    if target.starts_with("//") {
        return true;
    }
    match target.find(':') {
        Some(colon) => {
            let scheme = &target[..colon];
            !scheme.is_empty()
                && !scheme.contains(['/', '#', '.'])
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-'))
        }
        None => false,
    }
}

/// Every broken relative link of the Markdown files under `root`, one line each:
/// `file:line: target: what is wrong`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for link in links(&text) {
            if is_external(&link.target) {
                continue;
            }
            let (path, fragment) = match link.target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (link.target.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap_or(root).join(path)
            };
            let mut wrong = |what: String| {
                broken.push(format!("{shown}:{}: {}: {what}", link.line, link.target));
            };
            if !target.exists() {
                wrong(format!(
                    "{} does not exist",
                    target.strip_prefix(root).unwrap_or(&target).display()
                ));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if target.extension().is_none_or(|e| e != "md") || !target.is_file() {
                wrong("an anchor into something that is not a Markdown file".into());
                continue;
            }
            let target = target.canonicalize().unwrap_or(target);
            let known = anchors_of.entry(target.clone()).or_insert_with(|| {
                let text = std::fs::read_to_string(&target)
                    .unwrap_or_else(|e| panic!("{}: {e}", target.display()));
                anchors(&text)
            });
            if !known.contains(fragment) {
                wrong(format!("no heading has the anchor #{fragment}"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace();
    let files = markdown_files(root);
    for page in [
        "README.md",
        "BENCHMARKS.md",
        "docs/configuration.md",
        "deploy/systemd/README.md",
        "migrations/mssql/README.md",
        "vendor/README.md",
    ] {
        assert!(
            files.contains(&root.join(page)),
            "{page} is not among the files checked: {files:?}"
        );
    }
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with(root.join("vendor/lettre"))),
        "a vendored crate's own README is upstream's, not checked: {files:?}"
    );
    let broken = broken_links(root);
    assert!(
        broken.is_empty(),
        "broken links in the docs:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let root = workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|link| {
            link.target
                .split('#')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let pages: Vec<PathBuf> = markdown_files(&root.join("docs"));
    assert!(!pages.is_empty(), "docs/ holds no page");
    let unlinked: Vec<String> = pages
        .iter()
        .map(|page| page.strip_prefix(root).unwrap().display().to_string())
        .filter(|page| !linked.contains(page))
        .collect();
    assert!(
        unlinked.is_empty(),
        "pages of docs/ the README does not link to: {unlinked:?}"
    );
}

/// The checker itself finds what is broken, and only that: a missing file, a missing anchor in
/// another file and in the same one, an anchor into a file that is not Markdown.
#[test]
fn a_broken_link_is_reported_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::create_dir_all(root.join("vendor/upstream")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(root.join("notes.txt"), "text").unwrap();
    std::fs::write(
        root.join("docs/page.md"),
        "# A page\n\n## Who goes first: priority and `fair` share\n\n## Notes\n\n## Notes\n\n\
         Back to the [README](../README.md#two-commands).\n",
    )
    .unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Title\n\n## Two commands\n\n\
         [ok](docs/page.md) [ok](docs/page.md#who-goes-first-priority-and-fair-share)\n\
         [ok](docs/page.md#notes-1) [ok](#two-commands) [ok](https://example.com/x#y)\n\
         ![ok](notes.txt) [ok](docs/)\n\
         [missing file](docs/gone.md)\n\
         [missing anchor](docs/page.md#who-goes-first)\n\
         [missing here](#three-commands)\n\
         [not markdown](notes.txt#top)\n\
         `[in code](nowhere.md)`\n\
         ```\n[in a block](nowhere.md)\n```\n\
         [ref]: docs/also-gone.md\n",
    )
    .unwrap();
    // Neither the vendored crates' READMEs nor build output are checked.
    std::fs::write(root.join("vendor/upstream/README.md"), "[x](nowhere.md)\n").unwrap();
    std::fs::write(root.join("target/README.md"), "[x](nowhere.md)\n").unwrap();

    let broken = broken_links(root);
    assert_eq!(
        broken,
        [
            "README.md:8: docs/gone.md: docs/gone.md does not exist",
            "README.md:9: docs/page.md#who-goes-first: no heading has the anchor #who-goes-first",
            "README.md:10: #three-commands: no heading has the anchor #three-commands",
            "README.md:11: notes.txt#top: an anchor into something that is not a Markdown file",
            "README.md:16: docs/also-gone.md: docs/also-gone.md does not exist",
        ],
        "{broken:#?}"
    );
}

#[test]
fn headings_get_githubs_anchors() {
    let text = "# Benchmarks\n\n## CPU per delivery (`--only loopback`)\n\n\
                ### The seeds' settings (history, measured 2026-11-21)\n\n\
                ## The site's buffer, and when the site's disk fills\n\n\
                ## See [TLS](security.md#tls) first\n\n\
                ```sh\n# a comment, not a heading\n```\n\n## Notes\n\n## Notes\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = [
        "benchmarks",
        "cpu-per-delivery---only-loopback",
        "the-seeds-settings-history-measured-2026-11-21",
        "the-sites-buffer-and-when-the-sites-disk-fills",
        "see-tls-first",
        "notes",
        "notes-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
}
