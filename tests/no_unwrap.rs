//! Library code takes no `unwrap()` or `expect(..)`: bad input must give an error that names
//! the problem, never a panic. This scans `crates/*/src` (comments, doc examples, `#[cfg(test)]`
//! modules and the files they include left out) and fails on any call not in `ALLOWED`.
//!
//! A justified exception (an invariant the code itself establishes, never outside data) goes in
//! `ALLOWED` as (file, how many, why); the test also fails when a file has fewer than listed, so
//! the list stays exact.

use std::collections::BTreeMap;
use sapient_e2e::rs_files;
use std::path::{Path, PathBuf};

/// (file relative to the workspace root, number of calls, justification). Empty: no library
/// code unwraps today.
const ALLOWED: &[(&str, usize, &str)] = &[];

/// Module files declared under `#[cfg(test)]` (`#[cfg(test)] mod tests;`), relative to `file`;
/// with `all`, every module file it declares (those of a test module are test code too).
fn test_module_files(file: &Path, src: &str, all: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // A line before the first, so that a declaration there has one too.
    let lines: Vec<&str> = std::iter::once("").chain(src.lines().map(str::trim)).collect();
    for w in lines.windows(2) {
        if all || w[0].starts_with("#[cfg(test)]") {
            if let Some(name) = w[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let dir = if file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs") {
                    file.parent().map(Path::to_path_buf).unwrap_or_default()
                } else {
                    file.with_extension("")
                };
                out.push(dir.join(format!("{name}.rs")));
                out.push(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// Calls of `.unwrap()` / `.expect(` in the code of `src`, outside comments and test modules
/// (a `#[cfg(test)]` item ends at its closing brace), as line numbers.
/// Each line's code with the contents of string and char literals left out (strings may run
/// over several lines) and `//` comments removed, so braces and calls inside literals count
/// for nothing. Raw strings are read as plain ones, which is enough for this scan.
fn code_lines(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_str = false;
    for line in src.lines() {
        let cs: Vec<char> = line.chars().collect();
        let mut code = String::new();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if in_str {
                if c == '\\' {
                    i += 2;
                    continue;
                }
                if c == '"' {
                    in_str = false;
                    code.push('"');
                }
                i += 1;
                continue;
            }
            match c {
                '/' if cs.get(i + 1) == Some(&'/') => break,
                '"' => {
                    in_str = true;
                    code.push('"');
                }
                // A char literal ('x', '\n', '\u{7b}'); otherwise a lifetime.
                '\'' if cs.get(i + 1) == Some(&'\\') => match (i + 3..cs.len()).find(|&j| cs[j] == '\'') {
                    Some(j) => {
                        code.push_str("' '");
                        i = j;
                    }
                    None => code.push(c),
                },
                '\'' if cs.get(i + 2) == Some(&'\'') => {
                    code.push_str("' '");
                    i += 2;
                }
                _ => code.push(c),
            }
            i += 1;
        }
        out.push(code);
    }
    out
}

fn calls(src: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut skip_depth: Option<i64> = None;
    let mut cfg_test = false;
    for (i, code) in code_lines(src).iter().enumerate() {
        let t = code.trim();
        if let Some(d) = skip_depth.as_mut() {
            *d += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if *d <= 0 {
                skip_depth = None;
            }
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            cfg_test = true;
            continue;
        }
        if cfg_test {
            cfg_test = false;
            if t.ends_with(';') {
                continue;
            }
            let d = code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if d > 0 {
                skip_depth = Some(d);
            }
            continue;
        }
        let n = t.matches(".unwrap()").count() + t.matches(".expect(").count() - t.matches("self.expect(").count();
        out.extend(std::iter::repeat_n(i + 1, n));
    }
    out
}

#[test]
fn library_code_does_not_unwrap() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let Ok(crates) = std::fs::read_dir(root.join("crates")) else { panic!("no crates/ beside tests/") };
    for c in crates.flatten() {
        rs_files(&c.path().join("src"), &mut files);
    }
    assert!(files.len() > 50, "only {} source files found", files.len());
    let mut excluded = Vec::new();
    for f in &files {
        excluded.extend(test_module_files(f, &std::fs::read_to_string(f).unwrap_or_default(), false));
    }
    // The modules a test module declares, and theirs.
    let mut i = 0;
    while i < excluded.len() {
        let f = excluded[i].clone();
        if let Ok(src) = std::fs::read_to_string(&f) {
            excluded.extend(test_module_files(&f, &src, true).into_iter().filter(|c| !excluded.contains(c)).collect::<Vec<_>>());
        }
        i += 1;
    }
    let mut found: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for f in &files {
        if excluded.contains(f) {
            continue;
        }
        let lines = calls(&std::fs::read_to_string(f).unwrap_or_default());
        if !lines.is_empty() {
            let rel = f.strip_prefix(&root).unwrap_or(f).to_string_lossy().replace('\\', "/");
            found.insert(rel, lines);
        }
    }
    let mut problems = Vec::new();
    for (file, lines) in &found {
        let allowed = ALLOWED.iter().find(|a| a.0 == file).map_or(0, |a| a.1);
        if lines.len() > allowed {
            problems.push(format!("{file}: unwrap/expect at lines {lines:?} ({allowed} allowed): return an error instead"));
        }
    }
    for (file, n, _) in ALLOWED {
        let have = found.get(*file).map_or(0, Vec::len);
        if have < *n {
            problems.push(format!("{file}: {have} unwrap/expect calls left, ALLOWED lists {n}: lower it"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scanner_sees_calls_and_skips_tests_and_comments() {
    let src = "fn a() { x.unwrap(); }\n// y.unwrap()\n/// z.expect(\"doc\")\nfn b() { self.expect(m)?; q.expect(\"no\"); }\n#[cfg(test)]\nmod tests {\n    fn t() { v.unwrap(); }\n}\nfn c() { w.unwrap(); }\n";
    assert_eq!(calls(src), vec![1, 4, 9]);
    // Braces, quotes and calls inside string and char literals are not code.
    let src = "#[cfg(test)]\nmod tests {\n    const W: [&str; 3] = [\"}\", \"\\\"}\", \"}}\"];\n    fn t() { v.unwrap(); }\n}\nfn c() { let s = \"x.unwrap()\"; let b = '{'; w.unwrap(); }\n";
    assert_eq!(calls(src), vec![6]);
}
