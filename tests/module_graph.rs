//! No import circles inside `src/` (the library crate; `src/backend/` checked on its own too):
//! every module may use modules below it, never one that (directly or through others) uses it
//! back. The test reads the real source files, resolves
//! each `use` and each `crate::` / `super::` / `self::` path to the module file that defines its
//! prefix, and fails naming every strongly connected set of modules with the imports that close it.
//!
//! A module and its ancestors are not an edge: a parent declaring and re-exporting its children,
//! and a child using its parent's shared items (`super::CudaError`), is the module tree itself.
//! Inline modules (`mod tests { .. }`) count as part of their file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One module file: its path from the crate root (`["backend", "cuda", "moe"]`).
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other(char),
}

/// Tokens of `src` with comments, string and char literals removed, each with its line.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || (next == Some('#') && matches!(b.get(i + 2), Some('"') | Some('#'))))
        {
            // Raw string r"..", r#".."#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if b[j] == '\n' {
                    line += 1;
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): a lifetime has no closing quote
            // right after its first character.
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(b[s..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                i += 1;
            }
        } else {
            let t = match c {
                ':' if next == Some(':') => {
                    i += 1;
                    Tok::PathSep
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                ';' => Tok::Semi,
                '*' => Tok::Star,
                _ => Tok::Other(c),
            };
            out.push((t, line));
            i += 1;
        }
    }
    out
}

/// Expands a use tree starting at `toks[*i]` into full paths (`a::{b, c::d}` -> `a::b`, `a::c::d`);
/// a glob keeps its prefix. Stops after the tree (at `,`, `}` or `;`, not consumed).
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                let alias = match toks.get(*i + 1) {
                    Some((Tok::Ident(a), _)) => Some(a.clone()),
                    _ => None,
                };
                *i += 2;
                out.push((path, alias));
                return;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Star) => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Some(Tok::Open) => {
                *i += 1;
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Tok::Close) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Comma) => *i += 1,
                        None => return,
                        _ => use_tree(toks, i, &path, out),
                    }
                }
            }
            _ => {
                if path.last().is_some_and(|s| s == "self") {
                    path.pop();
                }
                out.push((path, None));
                return;
            }
        }
    }
}

/// One import: from which module file, at which line, of which full path; for a `pub use`, the
/// name it re-exports the item under.
struct Import {
    line: usize,
    path: Vec<String>,
    reexport: Option<String>,
}

/// The paths a module file names: `use` trees and `crate::`/`super::`/`self::` paths in code,
/// each resolved against the (possibly inline) module it sits in.
fn imports(module: &[String], src: &str) -> Vec<Import> {
    let toks = tokens(src);
    let mut out = Vec::new();
    // The inline modules open at this point, with the brace depth their body started at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let here = |inline: &[(String, usize)]| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < toks.len() {
        let (t, line) = (&toks[i].0, toks[i].1);
        match t {
            Tok::Open => {
                depth += 1;
                i += 1;
            }
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(s) if s == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Open, _))) = (toks.get(i + 1), toks.get(i + 2)) {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(s) if s == "use" => {
                // `pub use` or `pub(crate) use`: a re-export that paths through this module follow.
                let public = matches!(toks.get(i.wrapping_sub(1)), Some((Tok::Ident(p), _)) if p == "pub")
                    || (toks.get(i.wrapping_sub(1)).map(|t| &t.0) == Some(&Tok::Other(')'))
                        && matches!(toks.get(i.wrapping_sub(4)), Some((Tok::Ident(p), _)) if p == "pub"));
                i += 1;
                let mut trees = Vec::new();
                use_tree(&toks, &mut i, &[], &mut trees);
                let cur = here(&inline);
                for (p, alias) in trees {
                    // A `use` path without `crate`/`super`/`self` starts at a child module (or
                    // another crate: it then resolves to this module itself and is dropped).
                    let abs = absolute(&cur, &p).unwrap_or_else(|| [cur.clone(), p.clone()].concat());
                    let reexport = if public && inline.is_empty() { alias.or_else(|| p.last().cloned()) } else { None };
                    out.push(Import { line, path: abs, reexport });
                }
            }
            Tok::Ident(s)
                if (s == "crate" || s == "super" || s == "self")
                    && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep) =>
            {
                let mut p = Vec::new();
                while let Some((Tok::Ident(seg), _)) = toks.get(i) {
                    p.push(seg.clone());
                    i += 1;
                    if toks.get(i).map(|t| &t.0) != Some(&Tok::PathSep) {
                        break;
                    }
                    i += 1;
                }
                if let Some(abs) = absolute(&here(&inline), &p) {
                    out.push(Import { line, path: abs, reexport: None });
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// `p` from the crate root, or None for paths into other crates (`std::..`, `cudarc::..`) and
/// names brought into scope by an earlier `use` (those were counted at that `use`).
fn absolute(cur: &[String], p: &[String]) -> Option<Vec<String>> {
    let first = p.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => cur.to_vec(),
        "super" => cur.to_vec(),
        _ => return None,
    };
    let mut rest = &p[1..];
    if first == "super" {
        base.pop();
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every `.rs` file under `dir` with its module path (`mod.rs` is its folder's module, `lib.rs`
/// the crate root; `main.rs`, the binary, is another crate and left out).
fn module_files(root: &Path, dir: &Path, out: &mut BTreeMap<ModPath, PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("read a source folder").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            module_files(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(root).expect("under src");
            let mut m: ModPath = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            let last = m.pop().expect("a file name");
            if m.is_empty() && last == "main.rs" {
                continue;
            }
            if last != "mod.rs" && !(m.is_empty() && last == "lib.rs") {
                m.push(last.trim_end_matches(".rs").to_string());
            }
            out.insert(m, p);
        }
    }
}

/// The module file that defines the longest prefix of `path`.
fn owner<'a>(mods: &'a BTreeMap<ModPath, PathBuf>, path: &[String]) -> Option<&'a ModPath> {
    (1..=path.len()).rev().find_map(|n| mods.get_key_value(&path[..n]).map(|(k, _)| k))
}

fn is_prefix(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && a == &b[..a.len()]
}

/// Import edges between module files: (from, to) -> the lines of `from` that make it.
type Edges = BTreeMap<(ModPath, ModPath), Vec<usize>>;

/// The module file that defines what `path` names, following re-exports (`pub use`): a path
/// through a facade (`cuda::CudaBackend`, `ops::Gemv`) leads to the module that defines the item.
fn resolve<'a>(mods: &'a BTreeMap<ModPath, PathBuf>, reexports: &Reexports, path: &[String]) -> Option<&'a ModPath> {
    let mut path = path.to_vec();
    for _ in 0..16 {
        let m = owner(mods, &path)?;
        let Some(target) = path.get(m.len()).and_then(|name| reexports.get(&(m.clone(), name.clone()))) else {
            return Some(m);
        };
        path = [target.clone(), path[m.len() + 1..].to_vec()].concat();
    }
    None
}

/// (module, name) -> the full path a `pub use` of that module re-exports under that name.
type Reexports = BTreeMap<(ModPath, String), Vec<String>>;

fn edges(mods: &BTreeMap<ModPath, PathBuf>, sources: &BTreeMap<ModPath, String>) -> Edges {
    let all: BTreeMap<&ModPath, Vec<Import>> = sources.iter().map(|(m, src)| (m, imports(m, src))).collect();
    let reexports: Reexports = all
        .iter()
        .flat_map(|(m, imps)| imps.iter().filter_map(|i| Some((((*m).clone(), i.reexport.clone()?), i.path.clone()))))
        .collect();
    let mut e = Edges::new();
    for (m, imps) in &all {
        for imp in imps {
            let Some(to) = resolve(mods, &reexports, &imp.path) else { continue };
            if is_prefix(to, m) || is_prefix(m, to) {
                continue;
            }
            e.entry(((*m).clone(), to.clone())).or_default().push(imp.line);
        }
    }
    e
}

/// Strongly connected sets of more than one module (Tarjan), each sorted.
fn circles(nodes: &[ModPath], e: &Edges) -> Vec<Vec<ModPath>> {
    let idx: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut adj = vec![Vec::new(); nodes.len()];
    for (a, b) in e.keys() {
        if let (Some(&x), Some(&y)) = (idx.get(a), idx.get(b)) {
            adj[x].push(y);
        }
    }
    struct T<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for k in 0..t.adj[v].len() {
            let w = t.adj[v][k];
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let n = nodes.len();
    let mut t = T {
        adj: &adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    let mut out: Vec<Vec<ModPath>> = t
        .out
        .into_iter()
        .map(|c| {
            let mut c: Vec<ModPath> = c.into_iter().map(|i| nodes[i].clone()).collect();
            c.sort();
            c
        })
        .collect();
    out.sort();
    out
}

/// One report line per circle: its modules, then the imports inside it (file:line), the
/// two-way pairs first since each of them is a circle on its own.
fn describe(c: &[ModPath], e: &Edges, files: &BTreeMap<ModPath, PathBuf>) -> String {
    let name = |m: &ModPath| m.join("::");
    let set: BTreeSet<&ModPath> = c.iter().collect();
    let mut s = format!("circle of {}: {}\n", c.len(), c.iter().map(name).collect::<Vec<_>>().join(", "));
    let inside: Vec<_> = e.iter().filter(|((a, b), _)| set.contains(a) && set.contains(b)).collect();
    let mut pairs: Vec<_> = inside.iter().filter(|((a, b), _)| e.contains_key(&(b.clone(), a.clone()))).collect();
    pairs.retain(|((a, b), _)| a < b);
    for ((a, b), _) in &pairs {
        s += &format!("  two-way: {} <-> {}\n", name(a), name(b));
    }
    for ((a, b), lines) in &inside {
        let f = files.get(a).map(|p| p.display().to_string()).unwrap_or_default();
        s += &format!("  {} -> {} ({f}:{})\n", name(a), name(b), lines[0]);
    }
    s
}

/// The module files under `root/sub` (`sub` empty: all of `root`) and their sources.
fn load(root: &Path, sub: &str) -> (BTreeMap<ModPath, PathBuf>, BTreeMap<ModPath, String>) {
    let mut files = BTreeMap::new();
    module_files(root, &root.join(sub), &mut files);
    let sources =
        files.iter().map(|(m, p)| (m.clone(), std::fs::read_to_string(p).expect("read a source file"))).collect();
    (files, sources)
}

#[test]
fn backend_has_no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, sources) = load(&root, "backend");
    assert!(files.len() > 20, "found only {} module files under src/backend", files.len());
    let e = edges(&files, &sources);
    let nodes: Vec<ModPath> = files.keys().cloned().collect();
    let found = circles(&nodes, &e);
    let report: String = found.iter().map(|c| describe(c, &e, &files)).collect();
    assert!(found.is_empty(), "import circles inside src/backend/:\n{report}");
}

#[test]
fn src_has_no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, sources) = load(&root, "");
    assert!(files.len() > 100, "found only {} module files under src", files.len());
    assert!(files.contains_key(&Vec::new()), "lib.rs is the crate root");
    let e = edges(&files, &sources);
    let nodes: Vec<ModPath> = files.keys().cloned().collect();
    let found = circles(&nodes, &e);
    let m = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    let known: Vec<Vec<ModPath>> = KNOWN_CIRCLES.iter().map(|c| c.iter().map(|s| m(s)).collect()).collect();
    let new: Vec<&Vec<ModPath>> = found.iter().filter(|c| !known.contains(c)).collect();
    let report: String = new.iter().map(|c| describe(c, &e, &files)).collect();
    assert!(new.is_empty(), "import circles inside src/:\n{report}");
    // A known circle that is gone leaves the list, so that it cannot come back unnoticed.
    let gone: Vec<&Vec<ModPath>> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(gone.is_empty(), "circles no longer there, remove them from KNOWN_CIRCLES: {gone:?}");
}

/// Circles `src_has_no_import_circles` still tolerates, each sorted as the checker reports it
/// (none: the list may only shrink, and is empty).
const KNOWN_CIRCLES: &[&[&str]] = &[];

/// The checker itself finds a circle through a `use` group, a code path and a `super::super`
/// path, and ignores the parent-child relation and names inside comments and strings.
#[test]
fn checker_finds_a_circle_and_ignores_the_tree() {
    let m = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    let files: BTreeMap<ModPath, PathBuf> =
        ["backend", "backend::x", "backend::x::a", "backend::x::b", "backend::x::c"]
            .iter()
            .map(|s| (m(s), PathBuf::from(format!("{s}.rs"))))
            .collect();
    let sources: BTreeMap<ModPath, String> = [
        ("backend", "pub mod x; pub use x::a::A;"),
        ("backend::x", "pub mod a; pub use a::A; pub struct E;"),
        ("backend::x::a", "use super::{b::{B, self}, E};\n// use super::c::C;\nconst S: &str = \"super::c::C\";"),
        ("backend::x::b", "fn f() { let _ = super::super::x::c::g(); let _ = 'c'; }"),
        ("backend::x::c", "mod tests { use super::super::a::A; }\nfn g<'a>(_: &'a u8) {}"),
    ]
    .iter()
    .map(|(k, v)| (m(k), v.to_string()))
    .collect();
    let e = edges(&files, &sources);
    assert!(!e.contains_key(&(m("backend::x::a"), m("backend::x::c"))), "a comment or string is not an import: {e:?}");
    let nodes: Vec<ModPath> = files.keys().cloned().collect();
    let found = circles(&nodes, &e);
    assert_eq!(found, vec![vec![m("backend::x::a"), m("backend::x::b"), m("backend::x::c")]], "{e:?}");
}
