//! The workspace's shape, checked: which crate may depend on which (ARCHITECTURE.md, "Crates
//! and what they may depend on"), and no import cycle between the modules of any crate.
//!
//! A module's edges are the `crate::<module>` paths in its files, comments aside (a directory
//! module's files count as one module). Prints each crate's module layers, top to bottom.

use anyhow::{bail, Context, Result};
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every workspace crate (by directory) and the workspace crates it may depend on (by package
/// name). A crate missing here, or a dependency not allowed, fails the check.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("clients", &["zlink-wire"]),
    ("store", &["zlink-wire", "zlink-clients"]),
    // Not the store: lastresort must not link a CQL driver (invariant 8).
    ("redirect", &["zlink-wire", "zlink-clients"]),
    (
        "primary",
        &[
            "zlink-wire",
            "zlink-clients",
            "zlink-store",
            "zlink-redirect",
        ],
    ),
    (
        "replicator",
        &["zlink-wire", "zlink-clients", "zlink-store"],
    ),
    // Not primary: the counter's image ships no API.
    ("counter", &["zlink-wire", "zlink-clients", "zlink-store"]),
    // S3 and Kafka only: nothing of primary's, no store (invariant 8).
    (
        "lastresort",
        &["zlink-wire", "zlink-clients", "zlink-redirect"],
    ),
    ("drill", &["zlink-wire", "zlink-probe"]),
    ("probe", &[]),
    // The canary probes' modules are rendered from zlink_wire::canary.
    ("xtask", &["zlink-wire"]),
    (
        "tests",
        &[
            "zlink-wire",
            "zlink-clients",
            "zlink-store",
            "zlink-redirect",
            "primary",
            "replicator",
            "lastresort",
            "zlink-xtask",
        ],
    ),
];

/// Workspace members, from the root manifest.
pub fn members(root: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).context("root Cargo.toml")?;
    let list = Regex::new(r"members\s*=\s*\[([^\]]*)\]")
        .expect("regex")
        .captures(&text)
        .context("no members list")?[1]
        .to_string();
    Ok(Regex::new(r#""([^"]+)""#)
        .expect("regex")
        .captures_iter(&list)
        .map(|c| c[1].to_string())
        .collect())
}

/// Package names of workspace crates among a manifest's `[dependencies]` and
/// `[dev-dependencies]` (workspace crates are the ones named in `names`).
fn workspace_deps(manifest: &str, names: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = matches!(line, "[dependencies]" | "[dev-dependencies]");
            continue;
        }
        if !in_deps {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or("");
        if names.contains(name) {
            out.insert(name.to_string());
        }
    }
    out
}

/// Each workspace member's directory and `Cargo.toml` text, in the root manifest's order.
pub fn manifests(root: &Path) -> Result<Vec<(String, String)>> {
    members(root)?
        .into_iter()
        .map(|m| {
            let text = std::fs::read_to_string(root.join(&m).join("Cargo.toml"))
                .with_context(|| format!("{m}/Cargo.toml"))?;
            Ok((m, text))
        })
        .collect()
}

/// The `[package]` name of a manifest.
pub fn package_name(manifest: &str) -> Option<String> {
    Regex::new(r#"(?m)^name\s*=\s*"([^"]+)""#)
        .expect("regex")
        .captures(manifest)
        .map(|c| c[1].to_string())
}

/// Module → the modules it imports.
fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let path = Regex::new(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)").expect("regex");
    let group = Regex::new(r"(?:^|[{,\s])([a-z_][a-z0-9_]*)").expect("regex");
    let comment = Regex::new(r"//[^\n]*").expect("regex");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    collect_rs(src, &mut files)?;
    for f in files {
        let rel: Vec<_> = f
            .strip_prefix(src)
            .expect("under src")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if rel[0] == "bin" {
            continue;
        }
        let name = if rel.len() == 1 {
            rel[0].trim_end_matches(".rs").to_string()
        } else {
            rel[0].clone()
        };
        if rel.len() == 1 && (name == "lib" || name == "main") {
            continue;
        }
        let text = std::fs::read_to_string(&f)?;
        let text = comment.replace_all(&text, "");
        let edges = graph.entry(name).or_default();
        for m in path.captures_iter(&text) {
            let g = &m[1];
            if g.starts_with('{') {
                edges.extend(group.captures_iter(g).map(|c| c[1].to_string()));
            } else {
                edges.insert(g.to_string());
            }
        }
    }
    let known: BTreeSet<String> = graph.keys().cloned().collect();
    for (m, deps) in graph.iter_mut() {
        deps.retain(|d| known.contains(d) && d != m);
    }
    Ok(graph)
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            collect_rs(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// Layers bottom-up, or a cycle.
pub fn layers(graph: &BTreeMap<String, BTreeSet<String>>) -> Result<Vec<Vec<String>>, Vec<String>> {
    let mut left = graph.clone();
    let mut layers = Vec::new();
    while !left.is_empty() {
        let bottom: Vec<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        if bottom.is_empty() {
            // Walk until a module repeats: that is one cycle.
            let mut path = vec![left.keys().next().expect("non-empty").clone()];
            loop {
                let last = path.last().expect("non-empty");
                let next = left[last]
                    .iter()
                    .find(|d| left.contains_key(*d))
                    .expect("every module left has a dependency left")
                    .clone();
                if let Some(i) = path.iter().position(|m| *m == next) {
                    let mut cycle = path[i..].to_vec();
                    cycle.push(next);
                    return Err(cycle);
                }
                path.push(next);
            }
        }
        for m in &bottom {
            left.remove(m);
        }
        layers.push(bottom);
    }
    Ok(layers)
}

/// Checks every crate; returns the report (one line per crate) or fails with every problem.
pub fn check(root: &Path) -> Result<String> {
    let manifests = manifests(root)?;
    let names: BTreeSet<String> = manifests
        .iter()
        .filter_map(|(_, t)| package_name(t))
        .collect();
    let mut report = String::new();
    let mut problems = Vec::new();
    for (m, manifest) in &manifests {
        let Some((_, allowed)) = ALLOWED.iter().find(|(c, _)| c == m) else {
            problems.push(format!(
                "{m}: not in the allowed-dependencies table (xtask/src/layers.rs)"
            ));
            continue;
        };
        for dep in workspace_deps(manifest, &names) {
            if !allowed.contains(&dep.as_str()) {
                problems.push(format!("{m}: must not depend on {dep}"));
            }
        }
        let src = root.join(m).join("src");
        if !src.is_dir() {
            continue;
        }
        match layers(&module_graph(&src)?) {
            Ok(l) => {
                let shown: Vec<String> = l.iter().rev().map(|x| x.join(" ")).collect();
                report.push_str(&format!("{m}: {}\n", shown.join(" | ")));
            }
            Err(cycle) => problems.push(format!("{m}: import cycle {}", cycle.join(" → "))),
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(m, d)| (m.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn layers_bottom_up_and_cycles_named() {
        let g = graph(&[
            ("http", &["api", "error"]),
            ("api", &["error"]),
            ("error", &[]),
        ]);
        assert_eq!(
            layers(&g).unwrap(),
            vec![
                vec!["error".to_string()],
                vec!["api".into()],
                vec!["http".into()]
            ]
        );
        let c = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &[])]);
        assert_eq!(layers(&c).unwrap_err(), vec!["a", "b", "c", "a"]);
    }

    #[test]
    fn workspace_dependencies_are_read_from_both_sections() {
        let names: BTreeSet<String> = ["primary", "zlink-wire", "zlink-store"]
            .map(String::from)
            .into();
        let m = "[package]\nname = \"x\"\n[dependencies]\nzlink-wire.workspace = true\nserde = \"1\"\n[dev-dependencies]\nprimary = { path = \"../primary\" }\n[features]\nzlink-store = []\n";
        assert_eq!(
            workspace_deps(m, &names),
            ["primary", "zlink-wire"].map(String::from).into()
        );
    }

    #[test]
    fn this_workspace_passes() {
        let root = crate::workspace_root();
        check(&root).unwrap();
    }
}
