//! `cargo xtask tidy`: the architecture rules of `docs/ARCHITECTURE.md`,
//! checked mechanically.
//!
//! - Dependency arrows: each workspace crate may depend only on the
//!   workspace crates its row allows, and a crate with no row is an error.
//! - The pure cores (the state machine) have an allow-list of external
//!   crates, so that raft, crossbeam, slog or anything doing I/O cannot creep
//!   in, and their sources may not name clocks, threads, sockets, files,
//!   randomness or `HashMap`.
//! - No new import cycle between a crate's top-level modules (`crate::a`
//!   used in `b` and `crate::b` in `a`, directly or through others).
//! - Every Rust file in `crates/` and `xtask/` opens with a `//!` doc.
//! - No `todo!`, `unimplemented!`, `dbg!` or `#[ignore]` in the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use cargo_metadata::{DependencyKind, MetadataCommand};

/// The allowed arrows between workspace crates. A crate missing here fails
/// tidy: adding a crate means deciding its place in the graph.
const ARROWS: &[(&str, &[&str])] = &[
    ("fencelock-types", &[]),
    ("fencelock-fsm", &["fencelock-types"]),
    ("fencelock-lease", &["fencelock-types"]),
    // The pure node: consensus and the lock service, no I/O.
    ("fencelock-node", &["fencelock-types", "fencelock-fsm", "fencelock-lease"]),
    // The node's shells, stores on disk and snapshot worker.
    ("fencelock-raft", &["fencelock-types", "fencelock-fsm", "fencelock-node"]),
    ("fencelock-net", &["fencelock-types", "fencelock-tls"]),
    ("fencelock-client", &["fencelock-types", "fencelock-net", "fencelock-tls"]),
    // The async client runs the blocking client's sans-IO core.
    ("fencelock-client-async", &["fencelock-types", "fencelock-net", "fencelock-client"]),
    ("fencelock-cli", &["fencelock-types", "fencelock-client", "fencelock-tls"]),
    // Certificates: files, rcgen and x509-parser, no fencelock crate.
    ("fencelock-tls", &[]),
    (
        "fencelock-server",
        &[
            "fencelock-types",
            "fencelock-fsm",
            "fencelock-lease",
            "fencelock-raft",
            "fencelock-net",
            "fencelock-tls",
            // `fencelockd --join` asks the cluster to add it, as a client.
            "fencelock-client",
        ],
    ),
    ("fencelock-bench", &["fencelock-types", "fencelock-net", "fencelock-client", "fencelock-tls"]),
    ("fencelock-sim", &["fencelock-types", "fencelock-fsm", "fencelock-raft"]),
    ("fencelock-launch", &["fencelock-types", "fencelock-net", "fencelock-tls"]),
    ("fencelock-suite", &["fencelock-types", "fencelock-net", "fencelock-client", "fencelock-launch"]),
    // xtask builds and runs the crates; it links only the launcher, a small
    // crate (types, net's framing), so that `cargo xtask bench` and
    // `cargo xtask cluster` start fencelockd as the tests and suites do.
    ("xtask", &["fencelock-launch"]),
];

/// A pure core: its package, its source directory, the lists of crates it
/// may build on (besides [`TYPES_CLOSURE`]), and the banned words its
/// source may name all the same.
type PureCore = (&'static str, &'static str, &'static [&'static [&'static str]], &'static [&'static str]);

/// The pure cores and the whole set of crates (direct and indirect, normal
/// dependencies) each may build on.
/// Besides what [`TYPES_CLOSURE`] brings.
const PURE_CORES: &[PureCore] = &[
    // imbl: the lock table's persistent OrdMap, cloned in O(1) so that a
    // snapshot is encoded off the node loop. Deterministic: its only
    // randomness is a xoshiro generator seeded with 0 (imbl's Vector sort,
    // unused here); getrandom and its platform crates come in as rand_core's
    // optional OS source, which nothing in the core calls.
    ("fencelock-fsm", "crates/fsm/src", &[FSM_DEPENDENCIES], &[]),
    // std's HashMap for the lookup of a lease by key, which is never
    // walked (its order never shows); the hasher is the caller's.
    ("fencelock-lease", "crates/lease/src", &[], &["HashMap"]),
    // The whole node as a state machine: raft-rs and its protocol, the
    // state machine and lease timer, a logger it is given, and ahash for
    // the request queue's lookups (keyed per process, never iterated).
    // raft-rs brings rand for its election timeouts, which the simulator
    // pins from its seed.
    (
        "fencelock-node",
        "crates/node/src",
        &[&["fencelock-fsm", "fencelock-lease"], FSM_DEPENDENCIES, NODE_DEPENDENCIES],
        // It is the raft node, and it logs through the logger it is given.
        &["raft", "slog", "HashMap"],
    ),
];

/// The state machine's own dependencies (see its row in [`PURE_CORES`]).
const FSM_DEPENDENCIES: &[&str] = &[
    "crc32fast",
    "cfg-if",
    "imbl",
    "imbl-sized-chunks",
    "archery",
    "bitmaps",
    "rand_core",
    "rand_xoshiro",
    "getrandom",
    "libc",
    "r-efi",
    "wasi",
];

/// What the pure node builds on besides the state machine, the lease timer
/// and theirs: raft-rs and its own (fxhash, getset, rand for the election
/// timeouts that the simulator pins from its seed, and what those bring);
/// slog (with the serde support a structured drain switches on
/// workspace-wide); ahash.
const NODE_DEPENDENCIES: &[&str] = &[
    "wasip2",
    "wit-bindgen",
    "raft",
    "raft-proto",
    "fxhash",
    "byteorder",
    "getset",
    "rand",
    "rand_chacha",
    "ppv-lite86",
    "zerocopy",
    "zerocopy-derive",
    "slog",
    "erased-serde",
    "serde",
    "serde_core",
    "serde_derive",
    "anyhow",
    "once_cell",
    "ahash",
];

/// What every pure core may build on: the vocabulary crate and its own
/// dependencies.
const TYPES_CLOSURE: &[&str] = &[
    "fencelock-types",
    "protobuf",
    // protobuf's `bytes` feature, switched on workspace-wide by raft-proto.
    "bytes",
    "thiserror",
    "thiserror-impl",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
];

/// What the source of a pure core may not mention, and why.
const BANNED_IN_CORES: &[(&str, &str)] = &[
    ("std::time", "reads a clock"),
    ("Instant", "reads a clock"),
    ("SystemTime", "reads a clock"),
    ("std::thread", "spawns threads"),
    ("std::net", "does network I/O"),
    ("std::fs", "does file I/O"),
    ("std::io", "does I/O"),
    ("std::process", "runs processes"),
    ("std::env", "reads the environment"),
    ("rand::", "uses randomness"),
    ("HashMap", "iterates in an order that can differ between replicas"),
    ("HashSet", "iterates in an order that can differ between replicas"),
    ("raft", "knows raft"),
    ("crossbeam", "knows channels"),
    ("slog", "logs"),
];

pub fn run(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    let graph = Graph::load(root)?;
    check_arrows(&graph, &mut problems);
    for (package, src, allowed, may_mention) in PURE_CORES {
        check_core_dependencies(&graph, package, allowed, &mut problems);
        for file in rust_files(&root.join(src))? {
            let text = read(&file)?;
            for problem in scan_core_source(&text, may_mention) {
                problems.push(format!("{}: {problem}", relative(root, &file)));
            }
        }
    }
    check_cycles(root, &mut problems)?;
    for dir in ["crates", "xtask"] {
        for file in rust_files(&root.join(dir))? {
            let text = read(&file)?;
            for problem in scan_any_source(&text) {
                problems.push(format!("{}: {problem}", relative(root, &file)));
            }
        }
    }
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("tidy: {problem}");
        }
        bail!("tidy found {} problem(s)", problems.len());
    }
    println!("tidy: ok");
    Ok(())
}

fn check_arrows(graph: &Graph, problems: &mut Vec<String>) {
    for package in &graph.workspace {
        let Some((_, allowed)) = ARROWS.iter().find(|(name, _)| name == package) else {
            problems.push(format!(
                "crate {package} has no row in xtask/src/tidy.rs ARROWS: decide its place in the graph"
            ));
            continue;
        };
        for dependency in graph.direct(package) {
            if graph.workspace.contains(&dependency) && !allowed.contains(&dependency.as_str()) {
                problems.push(format!("arrow {package} -> {dependency} is not allowed"));
            }
        }
    }
}

fn check_core_dependencies(graph: &Graph, package: &str, allowed: &[&[&str]], problems: &mut Vec<String>) {
    let allowed: Vec<&str> = allowed.iter().flat_map(|list| list.iter().copied()).collect();
    for dependency in graph.transitive(package) {
        if !allowed.contains(&dependency.as_str()) && !TYPES_CLOSURE.contains(&dependency.as_str()) {
            problems.push(format!(
                "pure core {package} depends on {dependency}; it may build only on {allowed:?}"
            ));
        }
    }
}

/// The normal (not dev, not build) dependency graph of the workspace. Walked
/// by package id (two versions of a crate are two packages, with their own
/// dependencies), answered by package name.
struct Graph {
    workspace: BTreeSet<String>,
    names: BTreeMap<String, String>,
    ids: BTreeMap<String, String>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn load(root: &Path) -> Result<Graph> {
        let metadata =
            MetadataCommand::new().current_dir(root).exec().context("cannot read `cargo metadata`")?;
        let names: BTreeMap<String, String> = metadata
            .packages
            .iter()
            .map(|package| (package.id.repr.clone(), package.name.to_string()))
            .collect();
        let workspace: BTreeSet<String> =
            metadata.workspace_members.iter().filter_map(|id| names.get(&id.repr)).cloned().collect();
        // Workspace crates by name: their names are unique.
        let ids = metadata
            .workspace_members
            .iter()
            .filter_map(|id| names.get(&id.repr).map(|name| (name.clone(), id.repr.clone())))
            .collect();
        let resolve = metadata.resolve.context("`cargo metadata` gave no dependency graph")?;
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for node in resolve.nodes {
            let to = node
                .deps
                .iter()
                .filter(|dep| dep.dep_kinds.iter().any(|kind| kind.kind == DependencyKind::Normal))
                .map(|dep| dep.pkg.repr.clone());
            edges.entry(node.id.repr.clone()).or_default().extend(to);
        }
        Ok(Graph { workspace, names, ids, edges })
    }

    fn name(&self, id: &str) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_owned())
    }

    /// The names of the direct dependencies of workspace crate `package`.
    fn direct(&self, package: &str) -> BTreeSet<String> {
        let Some(id) = self.ids.get(package) else { return BTreeSet::new() };
        self.edges.get(id).into_iter().flatten().map(|dependency| self.name(dependency)).collect()
    }

    /// The names of every package workspace crate `package` builds on.
    fn transitive(&self, package: &str) -> BTreeSet<String> {
        let Some(id) = self.ids.get(package) else { return BTreeSet::new() };
        let mut seen = BTreeSet::new();
        let mut stack = vec![id.clone()];
        while let Some(next) = stack.pop() {
            for dependency in self.edges.get(&next).into_iter().flatten() {
                if seen.insert(dependency.clone()) {
                    stack.push(dependency.clone());
                }
            }
        }
        seen.iter().map(|id| self.name(id)).collect()
    }
}

/// Problems in the source of a pure core. Comments are skipped, so prose
/// may name what the code must not use.
fn scan_core_source(text: &str, may_mention: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for (number, line) in code_lines(text) {
        for (word, why) in BANNED_IN_CORES {
            if line.contains(word) && !may_mention.contains(word) {
                problems.push(format!("line {number}: `{word}` in a pure core ({why})"));
            }
        }
    }
    problems
}

/// Problems any Rust file in the tree may have.
fn scan_any_source(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !text.starts_with("//!") {
        problems.push("does not open with a `//!` module doc".to_owned());
    }
    for (number, line) in code_lines(text) {
        for marker in [
            concat!("todo", "!("),
            concat!("unimplemented", "!("),
            concat!("dbg", "!("),
            concat!("#[", "ignore"),
        ] {
            if line.contains(marker) {
                problems.push(format!("line {number}: `{marker}` left in the code"));
            }
        }
    }
    problems
}

/// Checks every crate under `crates/` for import cycles between its
/// top-level modules: every one found is a problem.
fn check_cycles(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .context("cannot list crates/")?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.join("src").is_dir())
        .collect();
    crates.sort();
    for dir in crates {
        let name = dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let mut files = Vec::new();
        for file in rust_files(&dir.join("src"))? {
            let module = top_module(&dir.join("src"), &file);
            files.push((module, read(&file)?));
        }
        for cycle in module_cycles(&files) {
            problems.push(format!(
                "crates/{name}: modules {} import one another (a cycle through `crate::` paths); \
             one must not use what uses it",
                cycle.join(", ")
            ));
        }
    }
    Ok(())
}

/// The top-level module a source file belongs to (`src/a.rs` and
/// `src/a/b.rs` are `a`); `None` for the crate root.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_string_lossy().into_owned();
    let module = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (module != "lib" && module != "main").then_some(module)
}

/// The cycles (strongly connected components of two modules or more,
/// each sorted) among the top-level modules of one crate, given each
/// file's module and text: `a` uses `b` when its code (not its comments)
/// names `crate::b` or `b` in a `use crate::{...}` list.
fn module_cycles(files: &[(Option<String>, String)]) -> Vec<Vec<String>> {
    let modules: BTreeSet<&str> = files.iter().filter_map(|(module, _)| module.as_deref()).collect();
    let mut uses: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, text) in files {
        let Some(module) = module.as_deref() else { continue };
        for (_, line) in code_lines(text) {
            for target in crate_paths(line) {
                if let Some(target) = modules.get(target.as_str()) {
                    if *target != module {
                        uses.entry(module).or_default().insert(target);
                    }
                }
            }
        }
    }
    // Kosaraju: finish order on the graph, then components on its reverse.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in &modules {
        let mut stack = vec![(*start, false)];
        while let Some((node, done)) = stack.pop() {
            if done {
                order.push(node);
                continue;
            }
            if !seen.insert(node) {
                continue;
            }
            stack.push((node, true));
            for next in uses.get(node).into_iter().flatten() {
                if !seen.contains(next) {
                    stack.push((next, false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, targets) in &uses {
        for to in targets {
            reverse.entry(to).or_default().insert(from);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut cycles = Vec::new();
    for start in order.iter().rev() {
        if assigned.contains(start) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![*start];
        assigned.insert(*start);
        while let Some(node) = stack.pop() {
            component.push(node.to_owned());
            for next in reverse.get(node).into_iter().flatten() {
                if assigned.insert(next) {
                    stack.push(next);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            cycles.push(component);
        }
    }
    cycles.sort();
    cycles
}

/// The first segment of every `crate::` path on a line, and the names in
/// a `use crate::{a, b::c}` list.
fn crate_paths(line: &str) -> Vec<String> {
    let ident = |text: &str| -> String {
        text.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
    };
    let mut found = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        let rest = &line[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start = true;
            for (i, c) in list.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_ascii_alphabetic() || c == '_') => {
                        found.push(ident(&list[i..]));
                        start = false;
                    }
                    c if !c.is_whitespace() => start = false,
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

/// Lines with their 1-based numbers, without `//` comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let code = line.split("//").next().unwrap_or("");
        (!code.trim().is_empty()).then_some((i + 1, code))
    })
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_may_name_raft_and_slog_but_never_a_clock_a_thread_a_file_or_a_channel() {
        let (.., may_mention) =
            PURE_CORES.iter().find(|(name, ..)| *name == "fencelock-node").expect("the node is a pure core");
        let text = "//! doc\nuse raft::RawNode;\nuse slog::Logger;\nlet t = std::time::Instant::now();\n\
                    std::thread::spawn(f);\nlet (tx, rx) = crossbeam_channel::bounded(1);\nstd::fs::read(p);\n";
        let problems = scan_core_source(text, may_mention);
        for word in ["std::time", "Instant", "std::thread", "crossbeam", "std::fs"] {
            assert!(problems.iter().any(|p| p.contains(&format!("`{word}`"))), "{word}: {problems:?}");
        }
        assert!(!problems.iter().any(|p| p.contains("`raft`") || p.contains("`slog`")), "{problems:?}");
    }

    #[test]
    fn cores_may_not_touch_clocks_sockets_or_raft() {
        let text = "//! doc\nuse std::time::Instant;\nuse std::net::TcpStream;\nuse raft::RawNode;\n";
        let problems = scan_core_source(text, &[]);
        assert!(problems.iter().any(|p| p.contains("std::time")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("std::net")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("raft")), "{problems:?}");
    }

    #[test]
    fn modules_that_import_one_another_are_a_cycle_and_comments_do_not_count() {
        let file = |module: &str, text: &str| (Some(module.to_owned()), format!("//! doc\n{text}"));
        let files = vec![
            file("a", "use crate::b::Thing;\n"),
            file("b", "use crate::{c, d::More};\n"),
            file("c", "fn f() -> crate::a::X { todo() }\n"),
            file("d", "// crate::a is named in a comment only\n"),
            file("e", "use crate::a;\n"),
            (None, "mod a; mod b; use crate::e;".to_owned()),
        ];
        assert_eq!(module_cycles(&files), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
        let acyclic = vec![file("a", "use crate::b;\n"), file("b", "use crate::c;\n"), file("c", "\n")];
        assert!(module_cycles(&acyclic).is_empty());
        assert_eq!(crate_paths("use crate::{x::{y, z}, w};"), vec!["x".to_owned(), "w".to_owned()]);
        assert_eq!(top_module(Path::new("src"), Path::new("src/a/b.rs")), Some("a".to_owned()));
        assert_eq!(top_module(Path::new("src"), Path::new("src/lib.rs")), None);
    }

    #[test]
    fn comments_may_name_what_code_may_not_use() {
        assert!(
            scan_core_source("//! no std::time here\n// nor a HashMap\nfn f() {} // raft\n", &[]).is_empty()
        );
    }

    #[test]
    fn files_need_a_module_doc_and_no_stubs() {
        let stub = concat!("fn f() { ", "todo", "!() }\n");
        assert_eq!(scan_any_source(stub).len(), 2);
        assert!(scan_any_source("//! doc\nfn f() {}\n").is_empty());
    }
}
