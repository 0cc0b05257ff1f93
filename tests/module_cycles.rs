//! Modules inside a crate depend one way: no module reaches, through `use` or `crate::` paths,
//! a module that reaches it back. This scans `crates/*/src` (comments and `#[cfg(test)] mod
//! tests` blocks left out), maps each file to its module, resolves `crate::`, `super::` and
//! `self::` paths (through the crate root's `pub use` re-exports) to the deepest module they
//! name, and fails on every strongly connected group of two or more modules that is not in
//! `ALLOWED`. A module and its own submodules may use each other (a parent owns its children).
//!
//! A listed group that has become acyclic fails too, so the list stays exact.

use std::collections::{BTreeMap, BTreeSet};
use sapient_e2e::rs_files;
use std::path::Path;

/// (crate, the modules of one cycle, sorted): cycles known and not yet taken apart (none now;
/// a new entry needs a reason).
const ALLOWED: &[(&str, &[&str])] = &[];

/// The module path of a source file (`a/b.rs` and `a/b/mod.rs` -> `a::b`; `lib.rs` -> ``).
fn module_of(src_dir: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src_dir).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without a trailing `#[cfg(test)] mod tests { .. }`.
fn code(src: &str) -> String {
    let mut out = String::new();
    for line in src.lines() {
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    if let Some(i) = out.find("#[cfg(test)]\nmod tests") {
        out.truncate(i);
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`, whitespace removed) into its paths.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        out.push(format!("{prefix}{tree}"));
        return;
    };
    let head = &tree[..open];
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&format!("{prefix}{head}"), &body[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < body.len() {
        expand(&format!("{prefix}{head}"), &body[start..], out);
    }
}

/// `use` paths starting at `crate`, `super` or `self`, and inline `crate::` paths.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        let after = &rest[i + 4..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let t = after.trim_start();
        if !(t.starts_with("crate::") || t.starts_with("super::") || t.starts_with("self::")) {
            continue;
        }
        let Some(end) = t.find(';') else { continue };
        let tree: String = t[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let tree = tree.split(" as ").next().unwrap_or(&tree).to_string();
        expand("", &tree, &mut out);
    }
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        let tail = &rest[i + 7..];
        rest = tail;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let p: String = tail.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        out.push(format!("crate::{p}"));
    }
    out
}

struct Crate {
    modules: BTreeMap<String, String>,
    /// `module::Name` re-exported by `pub use` -> the path it names.
    reexports: BTreeMap<String, Vec<String>>,
}

impl Crate {
    fn resolve(&self, path: &[String]) -> Option<String> {
        let mut path = path.to_vec();
        for i in (1..=path.len()).rev() {
            let k = path[..i].join("::");
            if !self.modules.contains_key(&k) {
                if let Some(target) = self.reexports.get(&k) {
                    let mut p = target.clone();
                    p.extend_from_slice(&path[i..]);
                    path = p;
                    break;
                }
            }
        }
        (1..=path.len()).rev().map(|i| path[..i].join("::")).find(|k| self.modules.contains_key(k))
    }
}

/// The module paths `m` depends on, outside itself, its ancestors and its descendants.
fn deps(c: &Crate, m: &str, src: &str) -> BTreeSet<String> {
    let here: Vec<String> = if m.is_empty() { vec![] } else { m.split("::").map(String::from).collect() };
    let mut out = BTreeSet::new();
    for p in paths(src) {
        let segs: Vec<String> = p.split("::").map(String::from).collect();
        let mut base = Vec::new();
        let mut i = 0;
        if segs[0] == "crate" {
            i = 1;
        } else {
            base = here.clone();
            while i < segs.len() && (segs[i] == "super" || segs[i] == "self") {
                if segs[i] == "super" {
                    base.pop();
                }
                i += 1;
            }
        }
        base.extend(segs[i..].iter().filter(|s| !s.is_empty() && *s != "*").cloned());
        let Some(t) = c.resolve(&base) else { continue };
        let related = t == m || m.is_empty() || t.is_empty() || m.starts_with(&format!("{t}::")) || t.starts_with(&format!("{m}::"));
        if !related {
            out.insert(t);
        }
    }
    out
}

/// Strongly connected groups of two or more modules (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct S<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = S { g: graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn modules_inside_a_crate_depend_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(dirs) = std::fs::read_dir(root.join("crates")) else { panic!("no crates/ beside tests/") };
    let mut found = Vec::new();
    let mut crates = 0;
    for d in dirs.flatten() {
        let src_dir = d.path().join("src");
        let mut files = Vec::new();
        rs_files(&src_dir, &mut files);
        if files.is_empty() {
            continue;
        }
        crates += 1;
        let name = d.file_name().to_string_lossy().into_owned();
        let mut c = Crate { modules: BTreeMap::new(), reexports: BTreeMap::new() };
        for f in &files {
            c.modules.insert(module_of(&src_dir, f), code(&std::fs::read_to_string(f).unwrap_or_default()));
        }
        for (m, src) in &c.modules.clone() {
            for (i, _) in src.match_indices("pub use ").chain(src.match_indices("pub(crate) use ")) {
                let rest = &src[i..];
                let rest = &rest[rest.find("use ").map_or(0, |u| u + 4)..];
                let Some(end) = rest.find(';') else { continue };
                let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
                let mut ps = Vec::new();
                expand("", tree.trim_start_matches("self::"), &mut ps);
                for p in ps {
                    let segs: Vec<String> = p.split("::").map(String::from).collect();
                    let Some(last) = segs.last() else { continue };
                    let mut key: Vec<String> = if m.is_empty() { vec![] } else { m.split("::").map(String::from).collect() };
                    key.push(last.clone());
                    let mut target: Vec<String> = if m.is_empty() { vec![] } else { m.split("::").map(String::from).collect() };
                    target.extend(segs);
                    c.reexports.insert(key.join("::"), target);
                }
            }
        }
        let graph: BTreeMap<String, BTreeSet<String>> = c.modules.iter().map(|(m, src)| (m.clone(), deps(&c, m, src))).collect();
        for cycle in cycles(&graph) {
            found.push((name.clone(), cycle));
        }
    }
    assert!(crates >= 10, "only {crates} crates found");
    let mut problems = Vec::new();
    for (name, cycle) in &found {
        if !ALLOWED.iter().any(|(c, ms)| c == name && ms.iter().copied().eq(cycle.iter().map(String::as_str))) {
            problems.push(format!("{name}: modules {cycle:?} use each other: let one depend on the other only"));
        }
    }
    for (c, ms) in ALLOWED {
        if !found.iter().any(|(name, cycle)| name == c && ms.iter().copied().eq(cycle.iter().map(String::as_str))) {
            problems.push(format!("{c}: {ms:?} listed in ALLOWED but no longer a cycle: remove it"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
