//! Static checks of `deploy/docker/Dockerfile`, since no container engine runs here: every
//! binary it builds, copies, runs or health-checks exists in the workspace, every `cargo build`
//! is `--locked`, the runtime runs as a non-root `USER`, and every service image has an
//! `ENTRYPOINT` and a `HEALTHCHECK`.

use crate::layers;
use anyhow::{bail, Context, Result};
use regex::Regex;
use std::collections::BTreeSet;
use std::path::Path;

/// The workspace's binaries (each member with `src/main.rs`, named after its package, and
/// every `src/bin/<name>.rs`) and its package names.
pub fn workspace(root: &Path) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let (mut bins, mut packages) = (BTreeSet::new(), BTreeSet::new());
    for (m, manifest) in layers::manifests(root)? {
        let name = layers::package_name(&manifest).with_context(|| format!("{m}: package name"))?;
        let dir = root.join(&m);
        if dir.join("src/main.rs").exists() {
            bins.insert(name.clone());
        }
        packages.insert(name);
        if let Ok(entries) = std::fs::read_dir(dir.join("src/bin")) {
            for e in entries {
                let p = e?.path();
                if let Some(stem) = p
                    .file_stem()
                    .filter(|_| p.extension().is_some_and(|x| x == "rs"))
                {
                    bins.insert(stem.to_string_lossy().into_owned());
                }
            }
        }
    }
    Ok((bins, packages))
}

/// Every problem found in `text` (a Dockerfile), given the workspace's binaries and packages.
pub fn problems(text: &str, bins: &BTreeSet<String>, packages: &BTreeSet<String>) -> Vec<String> {
    // Join continuation lines: one instruction per line.
    let joined = text.replace("\\\n", " ");
    let lines: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut out = Vec::new();
    let release = Regex::new(r"(?:target/(?:release|serve)|/out)/([A-Za-z0-9_-]+)").expect("regex");
    let package = Regex::new(r"-p\s+([A-Za-z0-9_-]+)").expect("regex");
    let exec_form = Regex::new(r#"\[\s*"([^"]+)""#).expect("regex");
    // (stage name, has ENTRYPOINT, has HEALTHCHECK)
    let mut stages: Vec<(String, bool, bool)> = Vec::new();
    let mut user = None;
    for l in &lines {
        let (instr, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
        match instr.to_ascii_uppercase().as_str() {
            "FROM" => {
                let name = rest
                    .split_whitespace()
                    .skip_while(|w| !w.eq_ignore_ascii_case("as"))
                    .nth(1);
                stages.push((name.unwrap_or("").to_string(), false, false));
            }
            "RUN" if rest.contains("cargo build") => {
                if !rest.contains("--locked") {
                    out.push(format!("cargo build without --locked: {rest}"));
                }
                for p in package.captures_iter(rest) {
                    if !packages.contains(&p[1]) {
                        out.push(format!(
                            "cargo build -p {}: no such workspace package",
                            &p[1]
                        ));
                    }
                }
            }
            "USER" => user = Some(rest.trim().to_string()),
            "ENTRYPOINT" | "HEALTHCHECK" => {
                let is_entry = instr.eq_ignore_ascii_case("ENTRYPOINT");
                match exec_form.captures(rest) {
                    Some(c) if bins.contains(&c[1]) => {}
                    Some(c) => {
                        out.push(format!("{instr} runs {:?}, not a workspace binary", &c[1]))
                    }
                    None => out.push(format!("{instr} not in exec form: {rest}")),
                }
                if let Some(s) = stages.last_mut() {
                    if is_entry {
                        s.1 = true;
                    } else {
                        s.2 = true;
                    }
                }
            }
            _ => {}
        }
        for c in release.captures_iter(l) {
            if !bins.contains(&c[1]) {
                out.push(format!("{:?} is not a workspace binary", &c[1]));
            }
        }
    }
    match user.as_deref() {
        None => out.push("no USER: the images would run as root".into()),
        Some("0" | "root") => out.push("USER is root".into()),
        Some(_) => {}
    }
    for (name, entry, health) in &stages {
        if *entry && !*health {
            out.push(format!("stage {name}: ENTRYPOINT without HEALTHCHECK"));
        }
    }
    if !stages.iter().any(|s| s.1) {
        out.push("no stage has an ENTRYPOINT".into());
    }
    out
}

/// Checks `deploy/docker/Dockerfile`; returns the service images it defines.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let path = root.join("deploy/docker/Dockerfile");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let (bins, packages) = workspace(root)?;
    let found = problems(&text, &bins, &packages);
    if !found.is_empty() {
        bail!("{}: {}", path.display(), found.join("; "));
    }
    Ok(Regex::new(r"(?mi)^FROM\s+runtime\s+AS\s+(\S+)")
        .expect("regex")
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_good_file_passes_and_each_mistake_is_named() {
        let bins = set(&["primary", "zlink-probe"]);
        let pkgs = set(&["primary", "zlink-probe"]);
        let good = "FROM rust AS build\nRUN cargo build --release --locked -p primary \\\n  -p zlink-probe && cp target/release/primary /out/\nFROM debian AS runtime\nUSER 10001\nFROM runtime AS primary\nCOPY --from=build /out/primary /usr/local/bin/\nHEALTHCHECK CMD [\"zlink-probe\", \"http\"]\nENTRYPOINT [\"primary\"]\n";
        assert_eq!(problems(good, &bins, &pkgs), Vec::<String>::new());
        let bad = |from: &str, to: &str| problems(&good.replace(from, to), &bins, &pkgs);
        assert_eq!(bad("--locked ", "").len(), 1);
        assert_eq!(bad("-p primary", "-p nope").len(), 1);
        assert_eq!(bad("/out/primary", "/out/gone").len(), 1);
        // The production profile's directory is read as the release one is.
        assert_eq!(
            bad("cp target/release/primary", "cp target/serve/primary").len(),
            0
        );
        assert_eq!(
            bad("cp target/release/primary", "cp target/serve/gone").len(),
            1
        );
        assert_eq!(bad("USER 10001", "USER root").len(), 1);
        assert_eq!(bad("USER 10001\n", "").len(), 1);
        assert_eq!(
            bad("HEALTHCHECK CMD [\"zlink-probe\", \"http\"]\n", "").len(),
            1
        );
        assert_eq!(bad("[\"primary\"]", "[\"curl\"]").len(), 1);
        assert_eq!(
            bad("ENTRYPOINT [\"primary\"]", "ENTRYPOINT primary").len(),
            1
        );
    }

    #[test]
    fn this_workspace_dockerfile_passes() {
        let root = crate::workspace_root();
        let images = check(&root).unwrap();
        assert_eq!(
            images,
            ["primary", "clicks", "replicator", "lastresort", "tls-init"]
        );
    }
}
